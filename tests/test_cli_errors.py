"""Bad input gets one clear line naming the problem and a non-zero exit, never a traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from onnx import TensorProto, helper

MLP = Path(__file__).resolve().parents[1] / "experiments" / "models" / "mlp.onnx"


def run(args):
    p = subprocess.run([sys.executable, "-m"] + args, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def assert_one_line_error(rc, err, *needles):
    assert rc != 0
    assert "Traceback" not in err
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_model(tmp_path):
    rc, _, err = run(["tuner.cli", "--model", str(tmp_path / "nope.onnx"), "--trials", "2"])
    assert_one_line_error(rc, err, "nope.onnx", "does not exist")


def test_corrupt_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage not protobuf" * 10)
    rc, _, err = run(["tuner.cli", "--model", str(bad), "--trials", "2"])
    assert_one_line_error(rc, err, "bad.onnx")


def test_unsupported_op(tmp_path):
    g = helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "fancy.onnx"
    path.write_bytes(m.SerializeToString())
    rc, _, err = run(["tuner.cli", "--model", str(path), "--trials", "2", "--db", f"sqlite:///{tmp_path}/x.db"])
    assert_one_line_error(rc, err, "FancyOp")


@pytest.mark.parametrize("trials", ["0", "-3"])
def test_bad_trials(trials):
    rc, _, err = run(["tuner.cli", "--model", str(MLP), "--trials", trials])
    assert_one_line_error(rc, err, "--trials")


@pytest.mark.parametrize("url", ["nosuchdriver://x/y", "postgresql+psycopg://nobody@127.0.0.1:1/none"])
def test_bad_db_url(url):
    rc, _, err = run(["tuner.cli", "--model", str(MLP), "--trials", "2", "--db", url])
    assert_one_line_error(rc, err, "database")


def test_out_of_range_shape(tmp_path):
    rc, _, err = run(["runtime.cli", "--model", str(MLP), "--dim", "batch=1:16", "--shape", "batch=64"])
    assert_one_line_error(rc, err, "batch", "64", "16")


def test_corrupt_plan(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    rc, _, err = run(["runtime.cli", "--model", str(MLP), "--plan", str(plan)])
    assert_one_line_error(rc, err, "plan.json")


def call(module: str, args, capsys):
    """A CLI's main in this process (cheap; the subprocess tests above cover the entry points)."""
    import importlib
    main = importlib.import_module(module).main
    try:
        rc = main(list(args))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


# -- every flag is checked before any work (issue 10, item 12) ------------------------------

@pytest.mark.parametrize("flag,value", [("--run-timeout", "-1"), ("--build-timeout", "0"), ("--run-timeout", "nan"),
                                        ("--repeat", "0"), ("--batch-size", "-2"), ("--number", "0"),
                                        ("--min-repeat-ms", "-5"), ("--measure-runs", "-1"), ("--seed", "-1"), ("--verify-runs", "-1"),
                                        ("--time-budget", "0"), ("--early-stopping", "0")])
def test_tune_rejects_bad_flag_values_up_front(tmp_path, capsys, flag, value):
    db = tmp_path / "x.db"
    rc, _, err = call("tuner.cli", ["--model", str(MLP), "--trials", "2", "--db", f"sqlite:///{db}", flag, value],
                      capsys)
    assert rc == 2
    assert_one_line_error(rc, err, flag, value)
    assert not db.exists(), "nothing may be opened before the flags are checked"


@pytest.mark.parametrize("module", ["tuner.cli", "runtime.cli"])
@pytest.mark.parametrize("args,needle", [(["--trials", "abc"], "--trials"), (["--seed", "x"], "--seed"),
                                         (["--no-such-flag"], "--no-such-flag")])
def test_argparse_errors_are_one_line(capsys, module, args, needle):
    if module == "runtime.cli" and args[0] == "--trials":
        args, needle = ["--bench", "abc"], "--bench"
    rc, _, err = call(module, ["--model", str(MLP)] + args, capsys)
    assert rc == 2
    assert_one_line_error(rc, err, needle)


@pytest.mark.parametrize("module", ["tuner.cli", "runtime.cli"])
@pytest.mark.parametrize("args,needle", [(["--dim", "batch=-1:4"], "batch=-1:4"), (["--dim", "batch=8:2"], "batch=8:2"),
                                         (["--shape", "batch=-2"], "batch=-2"), (["--shape", "batch=0"], "batch=0"),
                                         (["--dim", "batch=1:x"], "batch=1:x")])
def test_negative_or_bad_dims(capsys, module, args, needle):
    rc, _, err = call(module, ["--model", str(MLP)] + args + (["--trials", "2"] if module == "tuner.cli" else []),
                      capsys)
    assert rc == 2
    assert_one_line_error(rc, err, needle)


@pytest.mark.parametrize("flag,value", [("--bench", "-1"), ("--seed", "-3")])
def test_tune_run_rejects_negative_counts(capsys, flag, value):
    rc, _, err = call("runtime.cli", ["--model", str(MLP), flag, value], capsys)
    assert rc == 2
    assert_one_line_error(rc, err, flag, value)


@pytest.mark.parametrize("module", ["tuner.cli", "runtime.cli", "database.cli"])
@pytest.mark.parametrize("url", ["not a url", "postgresql+psycopg://u@h:notaport/db"])
def test_malformed_db_url(capsys, module, url):
    args = {"tuner.cli": ["--model", str(MLP), "--trials", "2", "--db", url],
            "runtime.cli": ["--model", str(MLP), "--db", url], "database.cli": ["--db", url, "stats"]}[module]
    rc, _, err = call(module, args, capsys)
    assert rc == 2
    assert_one_line_error(rc, err, "malformed")


def test_memory_error_is_one_line(tmp_path):
    """A size the machine cannot hold: `out of memory` naming the allocation, exit 2
    (address space capped so the test never takes the machine's memory)."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    p = subprocess.run([sys.executable, "-m", "runtime.cli", "--model", str(MLP), "--shape", "batch=50000000"],
                       capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert p.returncode == 2
    assert_one_line_error(p.returncode, p.stderr, "out of memory", "50000000")


def test_broken_stdout_pipe_is_not_an_internal_error(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--model", str(MLP), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # like `| head -0`
    err = p.stderr.read()
    assert p.wait(timeout=300) == 2
    assert "internal error" not in err and "Traceback" not in err, err


# -- tune-run --json reports warnings instead of printing them (issue 10, item 11) ------------

def _log_sum_model(tmp_path) -> Path:
    """ReduceLogSum over float64 runs on the NumPy reference (the reduce template compiles it
    for float32 only); rows of normal inputs that sum below 0 make NumPy warn ("invalid value
    encountered in log") at run time."""
    g = helper.make_graph([helper.make_node("ReduceLogSum", ["x"], ["y"], axes=[1], keepdims=1)], "logsum",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [16, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [16, 1])])
    path = tmp_path / "logsum.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_tune_run_json_reports_run_time_warnings(tmp_path):
    import json
    rc, out, err = run(["runtime.cli", "--model", str(_log_sum_model(tmp_path)), "--json"])
    assert rc == 0, err
    assert err.strip() == "", f"raw warnings on stderr: {err}"
    assert any("invalid value encountered in log" in w for w in json.loads(out)["warnings"])


def test_tune_run_json_reports_load_warnings(tmp_path):
    import json
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "tensortune-plan", "version": 1, "model": "mlp", "dims": {},
                                "target": {"key": "cpu-000000000000", "cpu": "elsewhere"}, "entries": []}))
    rc, out, err = run(["runtime.cli", "--model", str(MLP), "--plan", str(plan), "--json"])
    assert rc == 0, err
    assert err.strip() == ""
    assert any("cpu-000000000000" in w and "default configs" in w for w in json.loads(out)["warnings"])
