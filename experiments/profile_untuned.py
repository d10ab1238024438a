"""Per-step profiles of the untuned models (default configs) beside onnxruntime's own profile.

    python experiments/profile_untuned.py [--models resnet18 bert vit mobilenetv2 mobilenetv3] [--runs 30]
                                          [--threads 1] [--json out.json]

Each model is deployed untuned (`runtime.load` without a database), warmed up (the first
call compiles its kernels), then profiled with `runtime.profile` against onnxruntime on
the same inputs at the same thread count, their calls in turn. Prints each table; the
analysis is experiments/profile_untuned.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)   # both slow NumPy's BLAS (FACTS.md); before numpy loads
os.environ.pop("OPENBLAS_L2_SIZE", None)
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments"), str(ROOT / "experiments" / "models"), str(ROOT / "tests")]


def models() -> dict:
    """name -> (label, writer of the ONNX file into a folder, dim sizes)."""
    import onnx

    from bench_tuned import _models

    def built(name, proto):
        def write(folder: Path) -> Path:
            path = folder / f"{name}.onnx"
            onnx.save(proto(), path)
            return path
        return write
    out = {name: (label, built(name, proto), sizes) for name, (label, proto, sizes) in _models().items()}
    out["mobilenetv3"] = ("MobileNetV3-style (torch.onnx TorchScript export, 32x32 image)",
                          lambda folder: ROOT / "tests" / "real_models" / "mobilenetv3_torchscript.onnx", None)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default=None, help="write every profile's JSON here")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    import runtime
    from ir.settings import Settings, use
    from runtime.cli import random_feeds
    settings = Settings.from_env().with_(threads=args.threads)
    use(settings)
    table = models()
    names = args.models or list(table)
    results = {}
    with tempfile.TemporaryDirectory(prefix="profile_untuned_") as tmp, threadpool_limits(args.threads):
        for name in names:
            label, write, sizes = table[name]
            path = write(Path(tmp))
            model = runtime.load(path, settings=settings)
            if sizes is None:
                from real_models.cases import BY_NAME
                feeds = BY_NAME[path.stem].feeds(0)
            else:
                feeds = random_feeds(model.graph, dict(sizes), seed=0)
            t0 = time.perf_counter()
            model.run(feeds)
            first = time.perf_counter() - t0
            prof = model.profile(feeds, runs=args.runs, onnx_model=str(path))
            print(f"## {label}\n\nfirst call {first:.1f} s (compiles); load average {os.getloadavg()[0]:.1f}\n")
            print(prof.table(top=args.top), flush=True)
            print()
            results[name] = {"label": label, "first_call_s": first, "profile": prof.to_json()}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
