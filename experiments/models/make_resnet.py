"""Write ResNet-18 (dynamic batch) as ONNX. Builder: tests/models.py.

Run: python experiments/models/make_resnet.py [--image 224]   (writes resnet18.onnx beside this file, ~45 MB:
do not commit it)
"""
import argparse
import sys
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from models import make_resnet18  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--image", type=int, default=224, help="input height = width")
    ap.add_argument("--out", default=str(Path(__file__).with_name("resnet18.onnx")))
    args = ap.parse_args()
    onnx.save(make_resnet18(image=args.image), args.out)
    print(f"wrote {args.out}")
