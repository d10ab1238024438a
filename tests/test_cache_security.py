"""The kernel cache never runs what someone else put there, and a corrupt entry is
recompiled instead of failing every later run (issue 10, items 1 and 6).

Each case runs in a fresh subprocess with its own TENSORTUNE_CACHE, as a second
`tune-run` would: nothing is shared through numba's in-process state.
"""
from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "experiments" / "models" / "mlp.onnx"

# Build one small kernel; print whether numba loaded it from its cache.
BUILD = """
import json
from schedules import get_template
from tests.template_cases import make_wl
from codegen import cache_dir, compile_kernel
from ir.settings import Settings, use
import numpy as np
use(Settings.from_env())
t = get_template("elementwise")
wl = make_wl([("Relu", ["i0"], {})], [((4, 8), "float32", False)])
k = compile_kernel(t, wl, t.space(wl).get(0))
x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
assert np.array_equal(k.bind([None])([x]), np.maximum(x, 0))
print(json.dumps({"cached": k.artifact.cached, "path": str(cache_dir() / f"k_{k.artifact.key}.py")}))
"""


class Planted:
    """Unpickling this creates `path`: proof that a pickle from the cache was executed."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def run_py(code: str, cache: Path, timeout: int = 240):
    env = {**os.environ, "TENSORTUNE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_CACHE_DIR", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


def build_once(cache: Path) -> dict:
    p = run_py(BUILD, cache)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def numba_files(cache: Path, suffix: str) -> list[Path]:
    """numba's files for the kernel's functions (each compiles from its own `f_<key>.py`)."""
    return sorted((cache / "kernels" / "__pycache__").glob(f"f_*{suffix}"))


def plant(cache: Path, marker: Path) -> list[Path]:
    """Replace every numba index and data file with a pickle that creates `marker`."""
    files = numba_files(cache, ".nbi") + numba_files(cache, ".nbc")
    assert files
    for f in files:
        f.write_bytes(pickle.dumps(Planted(marker)))
    return files


def test_fresh_cache_directories_are_private(tmp_path):
    cache = tmp_path / "made" / "by" / "us"
    build_once(cache)
    for d in (tmp_path / "made", tmp_path / "made" / "by", cache, cache / "kernels", cache / "kernels" / "__pycache__"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.parametrize("where", [pytest.param("root", marks=pytest.mark.slow), "kernels",
                                   pytest.param("__pycache__", marks=pytest.mark.slow)])
def test_shared_cache_with_planted_pickle_is_refused(tmp_path, where):
    cache = tmp_path / "cache"
    build_once(cache)
    marker = tmp_path / "PWNED"
    plant(cache, marker)
    shared = {"root": cache, "kernels": cache / "kernels", "__pycache__": cache / "kernels" / "__pycache__"}[where]
    shared.chmod(0o777)
    p = run_py(BUILD, cache)
    assert not marker.exists(), "a planted pickle was unpickled"
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "CacheError" in last and str(shared) in last and "0777" in last, last


def test_tune_run_refuses_shared_cache_in_one_line(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    env = {**os.environ, "TENSORTUNE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "--model", str(MLP)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=240)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "writable by group or others" in lines[0] and str(cache) in lines[0], p.stderr
    assert not (cache / "kernels").exists(), "nothing may be written into a refused cache"


def test_cache_dir_above_not_swappable(tmp_path):
    """A parent that others can write (no sticky bit) lets them rename the cache away."""
    shared_parent = tmp_path / "shared"
    shared_parent.mkdir()
    shared_parent.chmod(0o777)
    p = run_py(BUILD, shared_parent / "cache")
    assert p.returncode != 0 and "above the cache" in p.stderr and str(shared_parent) in p.stderr, p.stderr


def test_private_cache_with_foreign_pickle_never_unpickles_it(tmp_path):
    """Even in a private directory numba only reads files whose sha256 we recorded."""
    cache = tmp_path / "cache"
    build_once(cache)
    marker = tmp_path / "PWNED"
    plant(cache, marker)
    again = build_once(cache)
    assert not marker.exists(), "a pickle we did not write was unpickled"
    assert again["cached"] is False  # discarded and recompiled
    assert build_once(cache)["cached"] is True  # the fresh entry is trusted again


@pytest.mark.parametrize("suffix", [pytest.param(".nbi", marks=pytest.mark.slow), ".nbc"])
def test_truncated_cache_file_is_discarded_and_recompiled(tmp_path, suffix):
    cache = tmp_path / "cache"
    assert build_once(cache)["cached"] is False
    assert build_once(cache)["cached"] is True
    for f in numba_files(cache, suffix):
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    again = build_once(cache)  # would be "UnpicklingError: pickle data was truncated" forever
    assert again["cached"] is False
    assert build_once(cache)["cached"] is True


def test_truncated_file_matching_its_manifest_is_still_recompiled(tmp_path):
    """A file cut short before we hashed it (full disk): numba fails to load it, we retry once."""
    cache = tmp_path / "cache"
    build_once(cache)
    pyc = cache / "kernels" / "__pycache__"
    import hashlib
    for f in numba_files(cache, ".nbi"):
        f.write_bytes(f.read_bytes()[:40])
        manifest = pyc / (f.name.split(".")[0] + ".sha256.json")
        digests = json.loads(manifest.read_text())
        digests[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
        manifest.write_text(json.dumps(digests))
    again = build_once(cache)
    assert again["cached"] is False
    assert build_once(cache)["cached"] is True


@pytest.mark.slow
def test_generated_source_file_edited_is_not_executed(tmp_path):
    """We run the source we render, not the file: an edited k_*.py changes nothing."""
    cache = tmp_path / "cache"
    first = build_once(cache)
    marker = tmp_path / "PWNED"
    path = Path(first["path"])
    path.write_text(f"open({str(marker)!r}, 'w')\n" + path.read_text())
    build_once(cache)
    assert not marker.exists()
