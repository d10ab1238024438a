"""Command names: `tensortune COMMAND` / `python -m tensortune` dispatch, and the check that
finds another package's `tune` on PATH (Ray's wheel installs one: Ray Tune's CLI).

The last tests do it for real: a virtual environment gets tensortune, then Ray installed after
it, which replaces `tune`; `tensortune tune` and `python -m tensortune tune` still tune,
`tensortune doctor` names the problem, and the fix it prints takes `tune` back."""
from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tomllib
import types
from importlib import metadata
from pathlib import Path

import pytest

from tensortune import __version__, cli, doctor

REPO = Path(__file__).resolve().parent.parent
MLP = REPO / "experiments" / "models" / "mlp.onnx"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# the wrapper pip writes for Ray's console script `tune` (ray 2.x), and for ours
RAY_TUNE = """#!/usr/bin/python3
# -*- coding: utf-8 -*-
import re
import sys
from ray.tune.cli.scripts import cli
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(cli())
"""


def our_wrapper(module="tuner.cli", interpreter=sys.executable):
    return RAY_TUNE.replace("#!/usr/bin/python3", f"#!{interpreter}").replace(
        "from ray.tune.cli.scripts import cli", f"from {module} import main").replace("cli())", "main())")


def write_script(folder: Path, name: str, text: str | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


# ---- dispatch ----------------------------------------------------------------------------------

def test_version_is_pyprojects():
    assert __version__ == PYPROJECT["project"]["version"]


def test_each_command_runs_what_its_console_script_runs():
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts["tensortune"] == "tensortune.cli:main"
    for name, command in cli.COMMANDS.items():
        if command.script and " " not in command.script:
            assert scripts[command.script] == command.target, name
    assert "tensortune*" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]


def test_commands_load_the_real_entry_points():
    import database.cli
    import runtime.cli
    import tuner.cli
    assert cli.load("tune") is tuner.cli.main
    assert cli.load("inspect") is tuner.cli.main
    assert cli.load("db") is database.cli.main
    assert cli.load("run") is runtime.cli.main
    assert cli.load("doctor") is doctor.main


def test_help_and_version(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "python -m tensortune" in out
    for name in cli.COMMANDS:
        assert re.search(rf"^  {name} ", out, re.M), name
    assert cli.main(["-V"]) == 0
    assert capsys.readouterr().out.strip() == f"tensortune {__version__}"


def test_no_command_or_unknown_command_is_a_usage_error(capsys):
    assert cli.main([]) == 2
    assert "usage: tensortune COMMAND" in capsys.readouterr().err
    assert cli.main(["tnue", "--model", "m.onnx"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'tnue'" in err and "tune, inspect, db" in err


@pytest.fixture
def fake_command(tmp_path, monkeypatch):
    """A command `fake` whose module records the arguments it was given."""
    (tmp_path / "fake_cli_module.py").write_text(
        "seen = []\n"
        "def main(argv):\n    seen.append(argv)\n    return 7 if argv[-1:] == ['fail'] else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "fake", cli.Command("fake_cli_module:main", "a test command", None, ("pre",)))
    yield
    sys.modules.pop("fake_cli_module", None)


def test_arguments_pass_verbatim_after_the_prefix_and_the_exit_code_comes_back(fake_command):
    assert cli.main(["fake", "--model", "x y.onnx", "--help", "--"]) == 0
    assert cli.main(["fake", "fail"]) == 7
    assert sys.modules["fake_cli_module"].seen == [["pre", "--model", "x y.onnx", "--help", "--"], ["pre", "fail"]]


def test_missing_command_module_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tuner.batch", None)   # as if tuner/batch.py were not installed
    assert cli.main(["batch", "a.onnx"]) == 2
    err = capsys.readouterr().err
    assert err == ("tensortune: error: 'tensortune batch' is not available in this installation "
                   "(module tuner.batch is missing; reinstall tensortune)\n")


def test_a_missing_dependency_inside_a_command_keeps_its_own_name(tmp_path, monkeypatch):
    (tmp_path / "needs_missing_dep.py").write_text("import no_such_dependency_4711\ndef main(argv): return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "dep", cli.Command("needs_missing_dep:main", "x"))
    with pytest.raises(ModuleNotFoundError) as e:
        cli.main(["dep"])
    assert e.value.name == "no_such_dependency_4711"


def test_db_help_and_inspect_through_tensortune(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["db", "--help"])
    assert e.value.code == 0 and "usage: tune-db" in capsys.readouterr().out
    assert cli.main(["inspect", str(MLP)]) == 0
    assert "3 fused subgraphs" in capsys.readouterr().out


# ---- detection on fake script files ----------------------------------------------------------

def test_rays_tune_on_path_is_a_problem_naming_the_owner_and_the_fix(tmp_path):
    write_script(tmp_path / "bin", "tune", RAY_TUNE)
    f = doctor.check("tune", path=str(tmp_path / "bin"))
    assert f.level == "problem"
    assert f"`tune` ({tmp_path / 'bin' / 'tune'}) is ray's (ray.tune.cli.scripts), not tensortune's" in f.text
    assert "use 'tensortune tune ...' or 'python -m tensortune tune ...'" in f.text
    assert "-m pip install --force-reinstall --no-deps " in f.text and "\n" not in f.text


def test_our_wrapper_is_ok_and_one_of_another_python_is_a_note(tmp_path):
    write_script(tmp_path / "a", "tune-db", our_wrapper("database.cli"))
    assert doctor.check("tune-db", path=str(tmp_path / "a")).level == "ok"
    write_script(tmp_path / "b", "tune-db", our_wrapper("database.cli", "/elsewhere/venv/bin/python"))
    f = doctor.check("tune-db", path=str(tmp_path / "b"))
    assert f.level == "note" and "runs another Python (/elsewhere/venv/bin/python)" in f.text
    write_script(tmp_path / "c", "tune-db", our_wrapper("tuner.cli"))   # the right name, another command
    assert doctor.check("tune-db", path=str(tmp_path / "c")).level == "problem"


def test_old_setuptools_wrapper_names_its_distribution(tmp_path):
    write_script(tmp_path / "bin", "tune", "#!/usr/bin/python3\n__requires__ = 'ray==2.9.0'\nimport sys\n"
                 "from pkg_resources import load_entry_point\n"
                 "sys.exit(load_entry_point('ray==2.9.0', 'console_scripts', 'tune')())\n")
    f = doctor.check("tune", path=str(tmp_path / "bin"))
    assert f.level == "problem" and "is ray's, not tensortune's" in f.text


def test_a_binary_launcher_cannot_be_read_and_says_so(tmp_path):
    write_script(tmp_path / "bin", "tune", b"\x7fELF\x02\x01\x01\x00\xff\xfe" * 40)
    f = doctor.check("tune", path=str(tmp_path / "bin"))
    assert f.level == "note" and "cannot tell whose it is" in f.text


def test_a_command_not_on_path(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "_declared", lambda: {"tune"})
    f = doctor.check("tune", path=str(tmp_path))
    assert f.level == "problem" and "`tune` is not on PATH" in f.text and "python -m tensortune tune" in f.text
    monkeypatch.setattr(doctor, "_declared", lambda: set())   # installed before the command existed
    assert "`tune` is not installed" in doctor.check("tune", path=str(tmp_path)).text


def fake_pyenv(tmp_path: Path, answer: str, rc: int = 0) -> Path:
    """A pyenv shim (the text pyenv writes) and a pyenv whose `which` gives `answer`."""
    pyenv = write_script(tmp_path / "root" / "libexec", "pyenv",
                         f"#!/bin/sh\n[ \"$1\" = which ] && [ \"$2\" = tune ] && echo '{answer}'\nexit {rc}\n")
    shim = ("#!/usr/bin/env bash\nset -e\n[ -n \"$PYENV_DEBUG\" ] && set -x\n\nprogram=\"${0##*/}\"\n\n"
            f"export PYENV_ROOT=\"{tmp_path / 'root'}\"\nexec \"{pyenv}\" exec \"$program\" \"$@\"\n")
    return write_script(tmp_path / "shims", "tune", shim).parent


def test_a_pyenv_shim_is_followed_to_the_script_it_runs(tmp_path):
    real = write_script(tmp_path / "versions" / "bin", "tune", RAY_TUNE)
    f = doctor.check("tune", path=str(fake_pyenv(tmp_path, str(real))))
    assert f.level == "problem" and f"`tune` ({real}) is ray's" in f.text
    shims = fake_pyenv(tmp_path / "none", "", rc=127)   # the active version has no `tune`
    assert doctor.find_command("tune", path=str(shims)) is None


@pytest.mark.parametrize("direct_url, target", [
    ({"url": "file:///src/tensor%20tune", "dir_info": {"editable": True}}, "-e '/src/tensor tune'"),
    ({"url": "file:///src/tt", "dir_info": {}}, "/src/tt"),
    ({"url": "https://files.example/tensortune-0.1.0.whl", "archive_info": {}}, "tensortune"),
    (None, "tensortune"),
])
def test_the_fix_reinstalls_the_install_at_hand(monkeypatch, direct_url, target):
    fake = types.SimpleNamespace(read_text=lambda name: json.dumps(direct_url) if direct_url else None)
    monkeypatch.setattr(doctor.metadata, "distribution", lambda name: fake)
    assert doctor.reinstall_command() == f"{sys.executable} -m pip install --force-reinstall --no-deps {target}"


def test_help_and_doctor_say_it_when_tune_is_not_ours(tmp_path, monkeypatch, capsys):
    bin_ = tmp_path / "bin"
    for name, (module, _) in doctor.OURS.items():
        write_script(bin_, name, our_wrapper(module))
    monkeypatch.setenv("PATH", str(bin_))
    assert cli.main(["doctor"]) == 0
    assert capsys.readouterr().out.count("ok: ") == len(doctor.OURS)
    cli.main(["--help"])
    assert "note:" not in capsys.readouterr().out
    write_script(bin_, "tune", RAY_TUNE)
    assert cli.main(["doctor"]) == 1
    assert "problem: `tune`" in capsys.readouterr().out
    cli.main(["--help"])
    assert "\nnote: `tune` (" in capsys.readouterr().out


# ---- for real: Ray installed after tensortune ---------------------------------------------------

NETWORK_DOWN = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                "Network is unreachable", "ConnectTimeoutError", "ProxyError", "Name or service not known")


def ray_requirement() -> str:
    """The Ray this environment has (its wheel is likely in pip's cache), else the extra's."""
    try:
        return f"ray=={metadata.version('ray')}"
    except metadata.PackageNotFoundError:
        return next(r for r in PYPROJECT["project"]["optional-dependencies"]["cluster"] if r.startswith("ray"))


def pip(python: Path, *args: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "--timeout", "30",
                           "--retries", "1", *args], capture_output=True, text=True, env=env, timeout=600)


def skip_if_offline(r: subprocess.CompletedProcess, what: str):
    if r.returncode and any(s in r.stdout + r.stderr for s in NETWORK_DOWN):
        pytest.skip(f"{what} needs the package index, which cannot be reached here")


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory):
    """(env vars, venv folder): tensortune installed, then Ray over it (`tune` is Ray's now).
    --without-pip: the venv's own bundled pip/setuptools are older than the machine's, which
    --system-site-packages gives it (with numpy, numba, ...)."""
    venv = tmp_path_factory.mktemp("shadowed") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}   # the venv's install runs
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"                    # as after `activate`
    python = venv / "bin" / "python"
    r = pip(python, "install", "--no-deps", "--no-build-isolation", "-e", str(REPO), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "from tuner.cli import main" in (venv / "bin" / "tune").read_text()
    # --ignore-installed: the machine's own Ray (seen through --system-site-packages) must not count
    r = pip(python, "install", "--no-deps", "--ignore-installed", ray_requirement(), env=env)
    skip_if_offline(r, f"installing {ray_requirement()}")
    assert r.returncode == 0, r.stdout + r.stderr
    return env, venv


def run(args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


@pytest.mark.long   # a virtual environment with Ray installed into it (CI runs it)
def test_ray_installed_after_us_takes_tune_and_tensortune_still_works(shadowed, tmp_path):
    env, venv = shadowed
    bin_ = venv / "bin"
    # the shadowing, reproduced: pip overwrote our wrapper with Ray Tune's, and `tune` no longer tunes
    assert "from ray.tune.cli.scripts import" in (bin_ / "tune").read_text()
    r = run([bin_ / "tune", "--model", MLP, "--trials", "2"], env, tmp_path)
    assert r.returncode != 0 and "Tune the kernels of an ONNX model" not in r.stdout + r.stderr
    # (Ray without its [tune] extra says "Can't import ray.tune as some dependencies are missing")

    db = f"sqlite:///{tmp_path / 'tuning.db'}"
    quick = ["--trials", "2", "--no-progress", "--measure-runs", "0", "--repeat", "1", "--min-repeat-ms", "1",
             "--db", db]
    r = run([bin_ / "tensortune", "tune", "--model", MLP, *quick], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "dense:MatMul+Add+Relu" in r.stdout and f"results in {db}" in r.stdout
    # the same through `python -m` (no script at all; the tuner's worker processes start from a package's
    # __main__ then); --no-resume measures the same two configs again, compiled already
    r = run([bin_ / "python", "-m", "tensortune", "tune", "--model", MLP, *quick, "--no-resume"], env, tmp_path)
    assert r.returncode == 0 and "dense:MatMul+Add+Relu" in r.stdout, r.stderr
    r = run([bin_ / "python", "-m", "tensortune", "db", "--db", db, "best"], env, tmp_path)
    assert r.returncode == 0 and "dense" in r.stdout, r.stderr

    r = run([bin_ / "tensortune", "doctor"], env, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    problem = next(line for line in r.stdout.splitlines() if line.startswith("problem: `tune`"))
    assert f"`tune` ({bin_ / 'tune'}) is ray's (ray.tune.cli.scripts), not tensortune's" in problem
    assert "use 'tensortune tune ...' or 'python -m tensortune tune ...'" in problem
    assert f"'{bin_ / 'python'} -m pip install --force-reinstall --no-deps -e {REPO}'" in problem
    assert "ok: `tune-db`" in r.stdout and "ok: `tune-run`" in r.stdout
    r = run([bin_ / "tensortune", "--help"], env, tmp_path)
    assert r.returncode == 0 and "\nnote: `tune` (" in r.stdout


@pytest.mark.long   # a virtual environment with Ray installed into it (CI runs it)
def test_the_fix_doctor_prints_takes_tune_back(shadowed, tmp_path):
    env, venv = shadowed
    r = run([venv / "bin" / "tensortune", "doctor", "tune"], env, tmp_path)
    fix = re.search(r"take `tune` back with '([^']+)'", r.stdout).group(1)
    assert fix.split()[:2] == [str(venv / "bin" / "python"), "-m"]
    r = subprocess.run(shlex.split(fix), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    skip_if_offline(r, "reinstalling with build isolation")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "from tuner.cli import main" in (venv / "bin" / "tune").read_text()
    r = run([venv / "bin" / "tensortune", "doctor", "tune"], env, tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok: `tune`"), r.stdout
    r = run([venv / "bin" / "tune", "--help"], env, tmp_path)
    assert r.returncode == 0 and "Tune the kernels of an ONNX model" in r.stdout
