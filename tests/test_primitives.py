"""Schedule primitives: each rewrite keeps the loop nest's meaning (checked by running the
printed source as plain Python, no numba) and has the shape it promises."""
from __future__ import annotations

import numpy as np
import pytest

from codegen.source import _emit
from schedules import primitives as P
from schedules.loopnest import UNROLLED, Assign, For, loops, thread_share


def run(stmts, **env):
    lines: list[str] = []
    _emit(stmts, 1, lines)
    src = "def f(" + ", ".join(env) + "):\n" + "\n".join(lines) + "\n"
    ns = {"np": np}
    exec(src, ns)
    ns["f"](*env.values())
    return src


def matmul_nest():
    """C[i, j] += A[i, k] * B[k, j] over i < M, j < N, k < K."""
    return (For("i", "0", "M", (For("j", "0", "N", (For("k", "0", "K", (Assign("C[i, j]", "A[i, k] * B[k, j]", "+"),)),)),)),)


@pytest.fixture
def mats():
    rng = np.random.default_rng(0)
    return rng.standard_normal((7, 5)), rng.standard_normal((5, 6))


def check_matmul(stmts, mats, **extra):
    A, B = mats
    C = np.zeros((7, 6))
    src = run(stmts, A=A, B=B, C=C, M=7, N=6, K=5, **extra)
    np.testing.assert_allclose(C, A @ B)
    return src


@pytest.mark.parametrize("tail", ["min", "guard"])
def test_split_handles_the_remainder(mats, tail):
    nest = P.split(matmul_nest(), "i", 4, tail=tail)          # 7 = 4 + 3: a partial tile
    assert [l.var for l in loops(nest)][:2] == ["i_o", "i_i"]
    check_matmul(nest, mats)


def test_split_then_unroll_needs_the_guard(mats):
    nest = P.unroll(P.split(matmul_nest(), "j", 4, tail="guard"), "j_i")
    assert any(l.kind == UNROLLED for l in loops(nest))
    src = check_matmul(nest, mats)
    assert "for j_i" not in src and src.count("if j < N") == 4
    with pytest.raises(P.ScheduleError):
        P.unroll(P.split(matmul_nest(), "j", 4, tail="min"), "j_i")  # bounds not constant


def test_reorder_and_fuse(mats):
    nest = P.reorder(matmul_nest(), "i", "j")
    assert [l.var for l in loops(nest)] == ["j", "i", "k"]
    check_matmul(nest, mats)
    fused = P.fuse(matmul_nest(), "i", "j", "ij")
    assert [l.var for l in loops(fused)] == ["ij", "k"]
    check_matmul(fused, mats)
    with pytest.raises(P.ScheduleError):
        P.reorder(matmul_nest(), "i", "k")   # not directly nested


def test_parallel_copies_take_contiguous_shares_that_cover_every_iteration(mats):
    nest = P.parallel(matmul_nest(), "i")
    A, B = mats
    C = np.zeros((7, 6))
    for t in range(3):                         # what parallel_for does with T = 3 threads
        run(nest, A=A, B=B, C=C, M=7, N=6, K=5, t=t, T=3)
    np.testing.assert_allclose(C, A @ B)
    assert loops(P.parallel(matmul_nest(), "i", mode="prange"))[0].kind == "parallel"
    # from a start other than 0: copy t's rows are one run, the runs in order, none twice
    owner = np.full(12, -1)
    shifted = P.parallel((For("i", "2", "M", (Assign("owner[i]", "t"),)),), "i")
    for t in range(5):
        run(shifted, owner=owner, M=12, t=t, T=5)
    assert owner[:2].tolist() == [-1, -1] and (np.diff(owner[2:]) >= 0).all() and set(owner[2:]) == set(range(5))


@pytest.mark.parametrize("items,T", [(54, 8), (7, 3), (3, 4), (1, 2), (0, 2)])
def test_thread_share_gives_each_copy_one_contiguous_run(items, T):
    """Copy t of T writes its index over its share: every item once, in T runs in copy order
    (neighbouring items, whose output blocks lie side by side, stay on one thread)."""
    owner = np.full(items, -1)
    for t in range(T):
        run((thread_share("it", "N", (Assign("owner[it]", "owner[it] + 1 + t"),)),), owner=owner, N=items, t=t, T=T)
    assert (owner >= 0).all() and (owner < T).all() and (np.diff(owner) >= 0).all()
    sizes = np.bincount(owner, minlength=T)
    assert sizes.sum() == items and sizes.max() - sizes.min() <= 1


def test_cache_write_accumulates_in_a_local(mats):
    nest = P.cache_write(matmul_nest(), "k", "C[i, j]", "acc")
    src = check_matmul(nest, mats)
    assert "acc += A[i, k] * B[k, j]" in src and "C[i, j] = acc" in src


def test_compute_inline_and_compute_at(mats):
    nest = P.cache_write(matmul_nest(), "k", "C[i, j]", "acc")
    relu = lambda v, target: ([("r", f"max({v}, 0.0)")], "r")  # noqa: E731
    nest = P.compute_inline(nest, "C", relu)
    nest = P.compute_at(nest, "j", (Assign("D[i, j]", "C[i, j] * 2.0"),))
    A, B = mats
    C, D = np.zeros((7, 6)), np.zeros((7, 6))
    run(nest, A=A, B=B, C=C, D=D, M=7, N=6, K=5)
    np.testing.assert_allclose(C, np.maximum(A @ B, 0))
    np.testing.assert_allclose(D, 2 * np.maximum(A @ B, 0))
    with pytest.raises(P.ScheduleError):
        P.compute_at(nest, "z", ())
