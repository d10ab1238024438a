"""Each function of a loop module compiles from its own cached file (issue 13: compile time):
a helper shared by two modules compiles once, functions that call one another stay together,
and an artifact still loads in another process (with its own cache) without compiling. The
CPU backend's lean source computes what the plain source computes."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

from codegen import build, get_backend
from codegen.source import render_function
from ir.settings import Settings
from schedules.loopnest import Alloc, Assign, Call, For, Function, LoopModule, Param

ROOT = Path(__file__).resolve().parents[1]
ARR = "float32[::1]"


def fill(value: float) -> Function:
    """out[i] = value: the same source in every module that uses it with the same value."""
    return Function("fill", (Param("out", ARR),), (
        For("i", "0", "out.shape[0]", (Assign("out[i]", f"np.float32({value})"),)),))


def scale(name: str, factor: int) -> Function:
    return Function(name, (Param("x", ARR), Param("out", ARR)), (
        For("i", "0", "x.shape[0]", (Assign("out[i]", f"x[i] * np.float32({factor})"),)),))


def tile() -> Function:
    """A 2x3 register tile stored through constant rows of a local buffer, then summed."""
    body = [Alloc("ct", ("2", "3"))]
    body += [Assign(f"c{r}_{q}", "np.float32(0.0)") for r in range(2) for q in range(3)]
    body += [For("k", "0", "x.shape[0]", tuple(Assign(f"c{r}_{q}", f"x[k] * np.float32({r + q + 1}.0)", "+")
                                             for r in range(2) for q in range(3)))]
    body += [Assign(f"ct[{r}, {q}]", f"c{r}_{q}") for r in range(2) for q in range(3)]
    body += [For("r", "0", "2", (For("q", "0", "3", (Assign("out[r * 3 + q]", "ct[r, q]"),)),))]
    return Function("tile", (Param("x", ARR), Param("out", ARR)), tuple(body))


def test_functions_that_call_each_other_stay_in_one_part():
    target = get_backend("cpu").target()
    caller = Function("twice", (Param("x", ARR), Param("out", ARR)), (Call("double(x, out)"), Call("double(out, out)")))
    module = LoopModule((fill(1.0), scale("double", 2), caller))
    parts = build.parts_for(module, target)
    assert [p.functions for p in parts] == [("fill",), ("double", "twice")]
    again = build.parts_for(LoopModule((scale("double", 2), fill(1.0), caller)), target)
    assert {p.key for p in again} == {p.key for p in parts}   # keys follow the source, not the module


def test_lean_source_computes_what_the_plain_source_computes():
    fn = tile()
    lean = render_function(fn, decorator=lambda f: "", lean=True)
    plain = render_function(fn, decorator=lambda f: "", lean=False)
    assert "ct_row1[2] = c1_2" in lean and "ct[1, 2] = c1_2" in plain
    assert lean.count("np.float32(0.0)") == 1 and plain.count("np.float32(0.0)") == 6
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    outs = []
    for src in (lean, plain):
        ns = {"np": np}
        exec(src, ns)
        out = np.zeros(6, np.float32)
        ns["tile"](x, out)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])
    assert np.allclose(outs[1], [x.sum() * (r + q + 1) for r in range(2) for q in range(3)], atol=1e-5)


def test_a_shared_helper_compiles_once_and_artifacts_load_elsewhere(tmp_path):
    settings = Settings(cache_dir=str(tmp_path / "builder"))
    backend = get_backend("cpu", settings)
    a = LoopModule((fill(3.0), scale("scale_a", 2)), doc="module a")
    b = LoopModule((fill(3.0), scale("scale_b", 5)), doc="module b")
    art_a = backend.compile(a)
    art_b = backend.compile(b)
    assert not art_a.cached and not art_b.cached
    shared = {p["key"] for p in art_a.meta["parts"]} & {p["key"] for p in art_b.meta["parts"]}
    assert len(shared) == 1   # fill
    fns_a, fns_b = backend.load(art_a), backend.load(art_b)
    assert fns_a["fill"] is fns_b["fill"]   # one compiled function for both modules
    kernels = tmp_path / "builder" / "kernels"
    assert len(list(kernels.glob("f_*.py"))) == 3 and len(list(kernels.glob("k_*.py"))) == 2
    out = np.zeros(4, np.float32)
    fns_b["scale_b"](np.arange(4, dtype=np.float32), out)
    assert out.tolist() == [0, 5, 10, 15]
    # another process with its own cache loads the artifact: numba's machine code, no compile
    (tmp_path / "art.pkl").write_bytes(pickle.dumps(art_b))
    code = f"""
import json, pickle, numpy as np
from codegen import get_backend
from ir.settings import Settings
art = pickle.load(open({str(tmp_path / "art.pkl")!r}, "rb"))
backend = get_backend("cpu", Settings(cache_dir={str(tmp_path / "runner")!r}))
fns = backend.load(art)
from codegen import build
cm = build.load_parts(art.source, art.key, [build.Part(p["key"], p["source"], tuple(p["functions"]))
                                            for p in art.meta["parts"]], backend.settings)
out = np.zeros(3, np.float32)
fns["fill"](out)
print(json.dumps({{"cached": cm.cached, "out": out.tolist()}}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_CACHE_DIR", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"cached": True, "out": [3.0, 3.0, 3.0]}
