"""PNG plots of the benchmark tables that their scripts write as Markdown only.

Run: python experiments/plot_tables.py   (reads bench_conv.md, bench_memory_bound.md,
bench_e2e.md, bench_e2e_tuned.md here; writes a .png beside each)
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def table(path: Path) -> list[dict]:
    """The first Markdown table of a file, as dicts keyed by header."""
    lines, started = [], False
    for line in path.read_text().splitlines():
        if line.startswith("|"):
            lines.append(line)
            started = True
        elif started:
            break
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip().strip("*") for c in l.strip("|").split("|")))) for l in lines[2:]]


def bars(path: Path, label_of, value_of, ylabel: str, title: str, ref: float | None = 1.0) -> None:
    rows = table(path)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar(range(len(rows)), [value_of(r) for r in rows])
    if ref is not None:
        ax.axhline(ref, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), [label_of(r) for r in rows], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=100)
    plt.close(fig)


def main():
    bars(HERE / "bench_conv.md", lambda r: r["layer"], lambda r: float(r["speed vs ORT"].rstrip("x")),
         "speed vs onnxruntime (higher is better)", "ResNet-18 convs, batch 1: conv2d template vs onnxruntime")
    bars(HERE / "bench_memory_bound.md", lambda r: r["workload"], lambda r: float(r["ours / copy"]),
         "GB/s / NumPy copy GB/s", "Memory-bound kernels vs the copy roofline", ref=None)
    for name in ("bench_e2e.md", "bench_e2e_tuned.md"):
        bars(HERE / name, lambda r: f"{r['model'].split()[0]} b{r['batch']} t{r['threads']}",
             lambda r: float(r["ratio"]), "tensortune / onnxruntime latency (lower is better)",
             "End to end vs onnxruntime (" + ("tuned" if "tuned" in name else "default configs") + ")")


if __name__ == "__main__":
    main()
