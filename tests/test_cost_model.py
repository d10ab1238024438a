"""Cost model and features: normalized targets, ranking quality on recorded dense data,
features comparable across shapes, transfer learning cuts trials on a new shape."""
from __future__ import annotations

import numpy as np
import pytest

from database import Database
from tests.simulated import SHAPES, TARGET, replay, table, trials_to_reach
from tuner.cost_model import Featurizer, RandomCostModel, make_cost_model, normalized_throughput
from tuner.tune import TuneOptions, tune_tasks


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def featurizer(shape):
    tasks, _, _ = replay([shape])
    return Featurizer(tasks[0].template, tasks[0].workload, table(shape).space)


def split(shape, n_train=200, seed=0):
    t = table(shape)
    idx = np.random.default_rng(seed).permutation(len(t.space))
    cfgs = [t.space.get(int(i)) for i in idx]
    f = featurizer(shape)
    x, lat = f(cfgs), [t.lookup(c) for c in cfgs]
    return (x[:n_train], lat[:n_train]), (x[n_train:], lat[n_train:])


def test_normalized_throughput_is_per_group_and_failures_score_zero():
    y = normalized_throughput([2.0, 1.0, None, 10.0, 20.0], ["a", "a", "a", "b", "b"])
    np.testing.assert_allclose(y, [0.5, 1.0, 0.0, 1.0, 0.5])


@pytest.mark.parametrize("name", ["xgb", "xgb-reg"])
def test_xgb_ranks_unseen_configs(name):
    (x, lat), (xt, latt) = split("128x256x1024")
    model = make_cost_model(name)
    model.fit(x, lat)
    rho = spearman(model.predict(xt), [-v for v in latt])
    assert rho > 0.4, rho   # a random model scores ~0 (next test)
    top = np.argsort(-model.predict(xt))[:20]
    assert np.median(np.array(latt)[top]) < np.percentile(latt, 10)


def test_random_model_does_not_rank():
    (_, _), (xt, latt) = split("128x256x1024")
    assert abs(spearman(RandomCostModel(0).predict(xt), [-v for v in latt])) < 0.1


def test_unknown_cost_model_is_a_clear_error():
    from ir.errors import TensortuneError
    with pytest.raises(TensortuneError, match="--cost-model 'nope'"):
        make_cost_model("nope")


def test_features_have_one_layout_across_shapes_and_see_the_loop_nest():
    fs = [featurizer(s) for s in SHAPES]
    widths = {f.width for f in fs}
    assert len(widths) == 1
    space = table(SHAPES[0]).space
    f = fs[0]
    small = next(c for c in space if c["regtile"] == "1x8")
    big = next(c for c in space if c["regtile"] == "8x16")
    rs, rb = f.row(small), f.row(big)
    n_knob = len(space.features(small))
    nest_s, nest_b = rs[n_knob + 5:n_knob + 12], rb[n_knob + 5:n_knob + 12]
    assert nest_b[0] == pytest.approx(np.log2(128)) and nest_s[0] == pytest.approx(np.log2(8))   # accumulators
    assert nest_b[2] > nest_s[2]                                                                 # intensity
    # problem sizes (log2 M, N, K) differ between shapes, so rows of two shapes are told apart
    assert list(fs[0].problem[:3]) == [7, 10, 8] and list(fs[1].problem[:3]) == [7, 8, 10]


def _tune_xgb(shape, seed, db, transfer):
    # trials, not time, are counted: no compile budget (it spends trials on cheap run-time
    # variants of built code shapes, which is what saves time: tests/test_compile_budget.py)
    tasks, b, r = replay([shape])
    return tune_tasks(tasks, db, TuneOptions(trials=150, strategy="xgb", seed=seed, progress=False,
                                             transfer=transfer, compile_share=None), TARGET, b, r)[0]


def test_transfer_learning_needs_fewer_trials_on_a_new_shape():
    """200 random records of 128x256x1024 in the database; tuning 128x1024x256 and
    256x256x256 with them reaches 95% of the recorded best in fewer trials (mean of 2 seeds
    per shape) than without."""
    src = Database("sqlite:///:memory:")
    tasks, b, r = replay(["128x256x1024"])
    tune_tasks(tasks, src, TuneOptions(trials=200, strategy="random", seed=99, progress=False), TARGET, b, r)
    prior = src.records()
    need = {True: [], False: []}
    for dst in ("128x1024x256", "256x256x256"):
        goal = table(dst).best / 0.95
        for transfer in (False, True):
            for seed in (0, 1):
                db = Database("sqlite:///:memory:")
                db.add_many(prior)
                rep = _tune_xgb(dst, seed, db, transfer)
                need[transfer].append(trials_to_reach(rep.history, goal) or 151)
    assert np.mean(need[True]) < 0.85 * np.mean(need[False]), need


def test_tasks_of_one_run_share_results_with_each_other(monkeypatch):
    """Two dense shapes tuned together: each xgb strategy trains on the other's results."""
    from tuner import callbacks
    seen = {}
    real = callbacks.share_results

    def spy(i, results, reports, strategies):
        real(i, results, reports, strategies)
        seen.update({j: len(s.prior) for j, s in enumerate(strategies)})

    monkeypatch.setattr(callbacks, "share_results", spy)
    tasks, b, r = replay(["128x256x1024", "256x256x256"])
    tune_tasks(tasks, Database("sqlite:///:memory:"),
               TuneOptions(trials=32, strategy="xgb", scheduler="round-robin", progress=False), TARGET, b, r)
    assert seen == {0: 16, 1: 16}
