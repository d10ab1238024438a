"""Custom ops through the public API (ir.custom + schedules.register_template): a plugin
(tests/softcap_plugin.py) tuned end to end by the `tune` CLI (its workers import the plugin),
then deployed with runtime.load and the tuned database; entry points; CLI errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime
from ir.custom import PluginError, register_op, same_shape
from runtime.cli import main as tune_run
from tuner.cli import main as tune

PLUGIN = str(Path(__file__).with_name("softcap_plugin.py"))
ROOT = str(Path(__file__).resolve().parents[1])


def softcap_model(shape=(32, 64), cap=5.0):
    node = helper.make_node("SoftCap", ["x"], ["y"], domain="example.ops", cap=cap, name="softcap")
    g = helper.make_graph([node], "softcap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.ops", 1)])
    m.ir_version = 9
    return m


def _expected(x, cap=5.0):
    return (cap * np.tanh(x / cap)).astype(np.float32)


def test_tune_cli_tunes_a_custom_op_and_runtime_deploys_it(tmp_path, capsys):
    path = tmp_path / "softcap.onnx"
    onnx.save(softcap_model(), path)
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    rc = tune(["--model", str(path), "--plugin", PLUGIN, "--db", url, "--trials", "4", "--batch-size", "4",
               "--strategy", "random", "--no-progress", "--measure-runs", "1", "--repeat", "2",
               "--min-repeat-ms", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "SoftCap" in out and "no template" not in out
    from database import Database
    records = [r for r in Database(url).records(template="softcap") if r.strategy != "in-model"]   # tune's own check
    assert len(records) == 4 and all(r.status == "ok" for r in records), [r.error for r in records]
    cm = runtime.load(str(path), db=url, plugins=[PLUGIN])
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32) * 8
    from ir.ops import OPS
    reference = OPS["SoftCap"].ref(cm.graph.nodes[0], [x])[0]   # the plugin's own NumPy reference
    np.testing.assert_allclose(cm(x), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reference, _expected(x), rtol=1e-6)
    cov = cm.coverage()
    assert cov.counts == {"tuned": 1}, cov.counts   # the tuned config of the plugin's template ran


def test_without_the_plugin_the_op_is_one_clear_error(tmp_path, capsys):
    path = tmp_path / "softcap.onnx"
    onnx.save(softcap_model((4, 8)), path)
    code = ("import runtime\n"
            "try:\n    runtime.load(%r)\nexcept Exception as e:\n    print(type(e).__name__, e)\n" % str(path))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert "UnsupportedOpError" in res.stdout and "SoftCap" in res.stdout and "softcap" in res.stdout
    assert tune_run(["--model", str(path), "--plugin", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.py" in err and "cannot be imported" in err


def test_tune_run_reads_plugins_from_the_environment(tmp_path, capsys, monkeypatch):
    path = tmp_path / "softcap.onnx"
    onnx.save(softcap_model((4, 8)), path)
    monkeypatch.setenv("TENSORTUNE_PLUGINS", PLUGIN)
    assert tune_run(["--model", str(path), "--json"]) == 0
    assert '"default": 1' in capsys.readouterr().out


def test_entry_point_plugin_loads_without_naming_it(tmp_path):
    """An installed package declaring a `tensortune.plugins` entry point: runtime.load finds it."""
    site = tmp_path / "site"
    (site / "demo_softcap-0.1.dist-info").mkdir(parents=True)
    (site / "demo_softcap-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-softcap\n"
                                                                 "Version: 0.1\n")
    (site / "demo_softcap-0.1.dist-info" / "entry_points.txt").write_text(
        "[tensortune.plugins]\nsoftcap = demo_softcap_ops\n")
    (site / "demo_softcap_ops.py").write_text(Path(PLUGIN).read_text())
    path = tmp_path / "softcap.onnx"
    onnx.save(softcap_model((4, 8)), path)
    code = ("import numpy as np, runtime\n"
            f"m = runtime.load({str(path)!r})\n"
            "x = np.linspace(-20, 20, 32, dtype=np.float32).reshape(4, 8)\n"
            "from schedules import all_templates\n"
            "assert {'dense', 'elementwise', 'softcap'} <= {t.name for t in all_templates()}\n"
            "print(float(np.abs(m(x) - 5 * np.tanh(x / 5)).max()), m.coverage().counts)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    assert res.returncode == 0, res.stderr[-2000:]
    err, counts = res.stdout.split(" ", 1)
    assert float(err) < 1e-5 and "'default': 1" in counts


def test_registration_conflicts_are_refused():
    with pytest.raises(PluginError, match="conflicts with a built-in op"):
        register_op("Relu", kind="elemwise", infer=same_shape, ref=lambda n, xs: xs)
    with pytest.raises(PluginError, match="unknown kind 'fancy'"):
        register_op("Fancy", kind="fancy", infer=same_shape, ref=lambda n, xs: xs)
