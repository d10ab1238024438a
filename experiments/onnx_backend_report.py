"""Run every ONNX backend node test through `runtime.load` (and onnxruntime, for comparison)
and write experiments/onnx_backend_results.md.

Run: python experiments/onnx_backend_report.py   (minutes: numba compiles each kernel once)
     python experiments/onnx_backend_report.py --print-gaps   (KNOWN_GAPS for tests/test_onnx_backend.py,
     from the last run's onnx_backend_results.json: paste it over the old one after a fix lands)
Same harness as tests/test_onnx_backend.py (`run_case`); a pass is counted only where every
output matches onnx's expected data at the test's tolerance, as onnx's own runner checks.
"""
from __future__ import annotations

import collections
import json
import re
import sys
import time
import warnings
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx.backend.test.runner import Runner, _normalize_tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_onnx_backend as backend  # noqa: E402


def _cause(e: BaseException) -> str:
    """A failure's cause in a few words: exception type and its message with names/numbers blanked."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    msg = re.sub(r"'[^']*'", "'…'", msg)
    msg = re.sub(r"\[[^\]]*\]", "[…]", msg)
    msg = re.sub(r"\d+", "N", msg)
    return f"{type(e).__name__}: {msg[:100]}"


# failure text -> the reason KNOWN_GAPS gives (first match wins); else the normalized text itself
REASONS = [
    (r"^test_(bernoulli|training_dropout)", "random output: values cannot match the reference generator's"),
    (r"got dtype \S+, expected|Items are not equal|dtype \S+, which tensortune cannot run|element type",
     "element type the importer reads as another (int16, uint16-64, bfloat16, float8, int4, string)"),
    (r"unbound dims", "shape from an unresolved annotation (unk__N): a dim nothing binds"),
    (r"axes input must be a constant", "reduction axes fed at run time: data-dependent output shape"),
    (r"op '…' \(node '…'\) is not supported by tensortune and the model does not annotate",
     "control flow or sequence op without a shape (If/Loop/Scan/SplitToSequence)"),
    (r"has no shape|not a tensor", "sequence/optional values are not tensors"),
]


def _reason(name: str, cause: str) -> str:
    for pattern, why in REASONS:
        if re.search(pattern, name if pattern.startswith("^test_") else cause):
            return why
    return cause


def print_gaps(results: dict) -> None:
    """KNOWN_GAPS as Python source: a test keeps the reason it is listed under, others get one."""
    listed = backend._gap_of()
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for name, cause in sorted(results.items()):
        if cause != "pass":
            groups[listed.get(name) or _reason(name, cause)].append(name)
    print("KNOWN_GAPS: dict[str, list[str]] = {")
    for why, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"    {why!r}: [")
        line = "       "
        for n in names:
            if len(line) + len(n) + 4 > 116:
                print(line)
                line = "       "
            line += f" {n!r},"
        print(line + "\n    ],")
    print("}")


def _ort_passes(case) -> bool:
    try:
        sess = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        for inputs, expected in case.data_sets:
            got = sess.run(None, dict(zip(names, [_normalize_tensor(x) for x in inputs])))
            Runner.assert_similar_outputs([_normalize_tensor(x) for x in expected], got,
                                          rtol=case.rtol, atol=case.atol, model_dir=None)
        return True
    except Exception:
        return False


def main() -> None:
    t0 = time.time()
    warnings.simplefilter("ignore")
    cases = backend.node_cases()
    gaps = backend._gap_of()
    passed, compiled, onnx_ref, ort_ok = 0, 0, 0, 0
    failures: dict[str, list[str]] = collections.defaultdict(list)
    unexpected, per_test = [], {}
    for k, (name, case) in enumerate(cases.items()):
        ort_ok += _ort_passes(case)
        try:
            model = backend.run_case(case)
        except Exception as e:
            why = gaps.get(name) or _cause(e)
            failures[why].append(name)
            per_test[name] = _cause(e)
            if name not in gaps:
                unexpected.append(name)
            continue
        finally:
            if k % 100 == 0:
                print(f"{k}/{len(cases)} {time.time() - t0:.0f} s", flush=True)
        per_test[name] = "pass"
        passed += 1
        compiled += backend.compiled_kernels(model) > 0
        onnx_ref += bool(model.coverage().fallback_ops)
        if name in gaps:
            unexpected.append(name)
    total = len(cases)
    lines = [
        "# ONNX backend node tests through `runtime.load`",
        "",
        f"Every node test shipped with onnx {onnx.__version__} (CPU), loaded with `runtime.load(model)` "
        "(default configs: compiled kernels where a template covers a subgraph, NumPy reference ops "
        "elsewhere) and called; outputs checked as onnx's backend runner does. onnxruntime "
        f"{ort.__version__} ran the same models in the same run. Generated by "
        f"`experiments/onnx_backend_report.py` in {time.time() - t0:.0f} s (AMD EPYC Zen 3, 2 cores shared).",
        "",
        "| node tests | passed | passed with ≥ 1 compiled kernel | passed with any node on onnx.reference | failed | onnxruntime passed |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {total} | **{passed}** | {compiled} | {onnx_ref} | {total - passed} | {ort_ok} |",
        "",
        "\"any node on onnx.reference\": the test passed, but at least one op has no NumPy reference "
        "of ours and ran through `onnx.reference` (the per-node fallback).",
        "",
        "## Failures by cause",
        "",
        "| cause | tests | examples |",
        "| --- | --- | --- |",
    ]
    for why, names in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"| {why.replace('|', '/')} | {len(names)} | {', '.join('`' + n + '`' for n in names[:3])} |")
    if unexpected:
        lines += ["", "## Not as tests/test_onnx_backend.py expects (update KNOWN_GAPS)", ""]
        lines += [f"- `{n}`" for n in unexpected]
    out = Path(__file__).with_name("onnx_backend_results.md")
    out.write_text("\n".join(lines) + "\n")
    # per test: "pass" or the failure's cause (what KNOWN_GAPS is updated from)
    out.with_suffix(".json").write_text(json.dumps(per_test, indent=0, sort_keys=True) + "\n")
    print(f"passed {passed}/{total} ({compiled} with compiled kernels); onnxruntime {ort_ok}; "
          f"{len(unexpected)} not as expected; wrote {out}")


if __name__ == "__main__":
    if "--print-gaps" in sys.argv:
        print_gaps(json.loads(Path(__file__).with_name("onnx_backend_results.json").read_text()))
    else:
        main()
