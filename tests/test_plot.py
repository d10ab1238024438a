"""Convergence plots: `tune --plot` (from the run's reports) and `tune-db plot` (from the
database afterwards). The data functions are checked against the reports; the PNG only
for being a real image."""
from __future__ import annotations

import struct
import sys

import pytest

from database import Database
from tests.helpers import dense_model
from tests.simulated import TARGET, replay
from tuner.plot import PlotError, from_records, from_reports, records_for_model, require_matplotlib
from tuner.tune import TuneOptions, estimated_latency, tune_tasks

SHAPES = ["128x256x1024", "256x256x256"]


def assert_png(path, min_bytes=5000):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 300 and height >= 200 and len(data) >= min_bytes


def tuned(db, trials=24, **kw):
    tasks, b, r = replay(SHAPES, weights=[2, 1])
    return tune_tasks(tasks, db, TuneOptions(trials=trials, progress=False, batch_size=4, **kw), TARGET, b, r)


def test_tune_plot_writes_a_png_whose_series_are_the_reports_history(tmp_path):
    png = tmp_path / "conv.png"
    reps = tuned(Database("sqlite:///:memory:"), plot=str(png))
    assert_png(png)
    conv = from_reports(reps)
    assert conv.best == [r.history for r in reps] and conv.weights == [2, 1]
    for j, r in enumerate(reps):
        xs, ys = conv.task_series(j)
        assert len(xs) == r.trials == len(ys) and xs == sorted(xs)
    assert sorted(conv.order) == sorted(j for j, r in enumerate(reps) for _ in range(r.trials))
    est = conv.estimate()
    assert len(est) == 24 and est[-1] == pytest.approx(estimated_latency(reps))
    # the estimate after trial n: weights x each task's best after its last trial up to n
    n = len(est) // 2
    seen = [conv.order[:n].count(j) for j in range(2)]
    want = sum(w * conv.best[j][seen[j] - 1] for j, w in enumerate(conv.weights)) if all(seen) else None
    assert est[n - 1] == pytest.approx(want)


def test_resumed_run_starts_the_estimate_from_the_stored_best():
    db = Database("sqlite:///:memory:")
    tuned(db, trials=16)
    reps = tuned(db, trials=4)
    conv = from_reports(reps)
    assert conv.start == [r.initial for r in reps] and None not in conv.start
    assert conv.estimate()[0] is not None       # the task not measured yet counts with its stored best


def test_tune_db_plot_draws_a_workload_from_its_records(tmp_path, capsys):
    from database.cli import main
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Database(url) as db:
        reps = tuned(db)
        key = reps[0].task.workload.key
        conv = from_records([("t", 1, db.records(workload_key=key))])
    assert conv.best[0] == reps[0].history          # records in insertion order replay the run
    png = tmp_path / "w.png"
    rc = main(["--db", url, "plot", key[:10], "--out", str(png)])
    out, err = capsys.readouterr()
    assert rc == 0 and err == "" and str(png) in out and f"{reps[0].trials} trials" in out
    assert_png(png)


def test_tune_db_plot_refuses_mixed_targets_and_missing_arguments(tmp_path, capsys):
    from database.cli import main
    from tests.test_database import GPU, rec, workload
    url = f"sqlite:///{tmp_path / 'm.db'}"
    with Database(url) as db:
        db.add_many([rec(workload(8), 1e-3, tile=1), rec(workload(8), 2e-6, target=GPU, tile=2)])
    key = workload(8).key
    rc = main(["--db", url, "plot", key, "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "give --target KEY" in err[0]
    rc = main(["--db", url, "plot", key, "--target", GPU["key"], "--out", str(tmp_path / "x.png")])
    assert rc == 0 and (tmp_path / "x.png").exists()
    rc = main(["--db", url, "plot", "--out", str(tmp_path / "y.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "workload KEY or --model" in err[-1]


def test_tune_db_plot_of_a_model_draws_every_task_and_the_estimate(tmp_path, capsys):
    """Records stored for the tasks `tune` extracts from the model, read back per task."""
    from database.cli import main
    from ir import import_onnx, simplify
    from tuner.measure import MeasureInput, MeasureResult
    from tuner.task import extract_tasks, shape_points
    from tuner.tune import to_record
    model = tmp_path / "m.onnx"
    model.write_bytes(dense_model(16, 64, 32).SerializeToString())
    g = simplify(import_onnx(model))
    tasks, _ = extract_tasks(g, shape_points(g.dims, None))
    url = f"sqlite:///{tmp_path / 'model.db'}"
    lat = [3e-4, 1e-4, 2e-4]
    with Database(url) as db:
        for t in tasks:
            cfg = t.template.default_config(t.workload)
            db.add_many([to_record(MeasureResult(MeasureInput(t.workload, t.template.name, cfg), "ok", [x]), TARGET,
                                   "random", t.template.version) for x in lat])
        groups = records_for_model(db, str(model))
    assert [n for n, _, _ in groups] == [t.name for t in tasks] and all(len(recs) == 3 for _, _, recs in groups)
    conv = from_records(groups)
    assert all(b == [3e-4, 1e-4, 1e-4] for b in conv.best)
    assert conv.estimate()[-1] == pytest.approx(sum(t.weight * 1e-4 for t in tasks))
    png = tmp_path / "model.png"
    assert main(["--db", url, "plot", "--model", str(model), "--out", str(png)]) == 0
    assert_png(png)


def test_without_matplotlib_plotting_is_one_clear_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    with pytest.raises(PlotError, match=r"pip install 'tensortune\[plot\]'"):
        require_matplotlib()
    from tuner.cli import main
    rc = main(["--model", "never-read.onnx", "--trials", "4", "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "matplotlib" in err[0]   # refused before any tuning
