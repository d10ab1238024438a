"""One dense shape: the untuned default against variants of it (other knob values) and NumPy,
on the same number of threads each (OpenBLAS pinned to it), in alternating rounds: what a
default change would buy.

Run: python experiments/dense/bench_knobs.py MxKxN [KNOB=VALUE[,KNOB=VALUE...] ...] [--rounds 5] [--threads 1]
e.g. python experiments/dense/bench_knobs.py 1024x1024x1024 regtile=4x64 KB=512 regtile=4x64,KB=512

Per variant: the default config (parallel only with --threads > 1) with those knobs over it; GFLOP/s of the
fastest of 5 calls per round, median over the rounds.
"""
import os
import sys

THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
os.environ["OPENBLAS_NUM_THREADS"] = str(THREADS)   # before NumPy loads (bench_gemv keeps it)
for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # they slow a current numpy (FACTS.md)
    os.environ.pop(var, None)

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402


sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from codegen.backend import get_backend  # noqa: E402
from ir.settings import Settings, use  # noqa: E402
from bench_gemv import timed_against_numpy  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 too)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", help="MxKxN")
    ap.add_argument("variants", nargs="*", help="KNOB=VALUE[,KNOB=VALUE...] over the default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    use(Settings.from_env())
    backend = get_backend(None, Settings.from_env().with_(threads=args.threads))
    from codegen.cpu import _host
    from schedules import get_template
    from tests.template_cases import make_wl, precompile
    dense = get_template("dense")
    m, k, n = (int(v) for v in args.shape.split("x"))
    wl = make_wl([("MatMul", ["i0", "i1"], {})], [((m, k), "float32", False), ((k, n), "float32", True)])
    base = {**dense.default_config(wl).to_json(), "parallel": args.threads > 1}
    cfgs = [dense.space(wl).validate(base)]
    for v in args.variants:
        knobs = dict(kv.split("=", 1) for kv in v.split(","))
        cfgs.append(dense.space(wl).validate({**base, **{a: int(b) if b.isdigit() else b for a, b in knobs.items()}}))
    precompile("dense", [(wl, c) for c in cfgs])
    times = timed_against_numpy(dense, wl, cfgs, backend, args.rounds, calls=5)
    h = _host()
    print(f"{args.shape}, {h['cpu']} ({h['cpu_name']}), {h['vector_bits']}-bit vectors, "
          f"{args.threads} thread{'s' if args.threads > 1 else ''}")
    for name, t in zip(["default"] + args.variants + ["NumPy"], times):
        print(f"  {name:32s} {2 * m * k * n / t / 1e9:6.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
