"""A model's BLAS steps run on the model's threads, not on every core (codegen.backend.blas_on_threads)."""
import numpy as np

from codegen.backend import _blas_controllers, blas_on_threads, get_backend
from ir.settings import Settings


def test_blas_call_runs_on_the_given_threads_and_restores_the_setting():
    libs = _blas_controllers()
    assert libs, "NumPy's BLAS was not found by threadpoolctl"
    original = [lib.get_num_threads() for lib in libs]
    try:
        for lib in libs:
            lib.set_num_threads(2)
        seen = []
        probe = blas_on_threads(lambda: seen.append([lib.get_num_threads() for lib in libs]), 1)
        probe()
        assert seen == [[1] * len(libs)]
        assert [lib.get_num_threads() for lib in libs] == [2] * len(libs)

        def fails():
            raise ValueError("inside")
        try:
            blas_on_threads(fails, 1)()
        except ValueError:
            pass
        assert [lib.get_num_threads() for lib in libs] == [2] * len(libs)
    finally:
        for lib, n in zip(libs, original):
            lib.set_num_threads(n)


def test_cpu_library_matmul_is_numpys_matmul_on_one_thread():
    backend = get_backend("cpu", Settings.from_env().with_(threads=1))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 48), np.float32), rng.standard_normal((48, 32), np.float32)
    out = np.empty((64, 32), np.float32)
    backend.library("matmul")(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
