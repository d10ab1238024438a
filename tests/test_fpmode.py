"""Denormals flushed while tensortune's CPU kernels run (`codegen.fpmode`), the caller's own
floating-point mode back after: on Intel cores an operation on a denormal costs ~100 cycles
(BERT's attention context matmul on masked softmax rows ran 40x slower)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from codegen import fpmode

pytestmark = pytest.mark.skipif(not fpmode.AVAILABLE, reason="MXCSR is x86-64's")

TINY = np.float32(1e-39)   # denormal: below float32's smallest normal, 1.18e-38
CONTROL = 0xFFC0           # MXCSR's mode bits (the low 6 are sticky exception flags)


def _ieee_product() -> np.float32:
    return np.float32(np.array([TINY], np.float32)[0] * np.float32(1.0))


def test_flushed_sets_ftz_and_daz_and_restores_the_callers_mode():
    before = fpmode.mxcsr()
    assert before & fpmode.FTZ_DAZ == 0 and _ieee_product() == TINY
    with fpmode.flushed():
        assert fpmode.mxcsr() & fpmode.FTZ_DAZ == fpmode.FTZ_DAZ
        assert _ieee_product() == 0.0
        with fpmode.flushed():
            pass
        assert fpmode.mxcsr() & fpmode.FTZ_DAZ == fpmode.FTZ_DAZ   # a nested exit keeps the outer mode
    assert fpmode.mxcsr() & CONTROL == before & CONTROL and _ieee_product() == TINY


def test_a_model_call_runs_its_kernels_flushed_and_hands_the_mode_back(tmp_path):
    import runtime
    w = np.eye(32, dtype=np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
                          [numpy_helper.from_array(w, "w")])
    path = tmp_path / "mm.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    m = runtime.load(str(path))
    x = np.full((4, 32), TINY, np.float32)
    x[0] = 1.0
    y = m(x)
    y = y if isinstance(y, np.ndarray) else next(iter(y.values())) if isinstance(y, dict) else y[0]
    np.testing.assert_array_equal(y[0], np.ones(32, np.float32))
    assert not y[1:].any()                      # denormal inputs read as zero (IEEE: 1e-39 each)
    assert fpmode.mxcsr() & fpmode.FTZ_DAZ == 0 and _ieee_product() == TINY   # the caller's mode is back


def test_nothing_compiles_before_the_cpu_backend_chooses_wide_vectors():
    """numba fixes its CPU features at its first compile: if the mode functions (or anything
    imported with the packages) compiled before `codegen.cpu` dropped `prefer-256-bit`, every
    kernel of the process would be built for 256-bit vectors on AVX-512 (it happened once)."""
    import os
    import subprocess
    import sys
    from numba.core.codegen import get_host_cpu_features
    if "+avx512f" not in get_host_cpu_features().split(",") or os.environ.get("TENSORTUNE_PREFER_256") == "1" \
            or os.environ.get("NUMBA_CPU_FEATURES"):
        pytest.skip("needs an AVX-512 host with the default features")
    code = ("from codegen import fpmode\n"
            "with fpmode.flushed(): pass\n"
            "import ir, schedules, tuner, database, runtime\n"
            "from codegen.cpu import _host\n"
            "print(_host()['vector_bits'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "512", out.stdout
