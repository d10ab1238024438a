"""Write a BERT-style encoder (4 layers, hidden 256, 4 heads; dynamic batch and seq) as ONNX.
Builder: tests/models.py.

Run: python experiments/models/make_bert.py   (writes bert.onnx beside this file, ~17 MB: do not commit it)
"""
import argparse
import sys
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from models import make_bert  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).with_name("bert.onnx")))
    args = ap.parse_args()
    onnx.save(make_bert(layers=args.layers), args.out)
    print(f"wrote {args.out}")
