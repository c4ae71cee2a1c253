"""``torchyard metrics ID --plot out.png``: one panel per metric, value against step."""

from __future__ import annotations

from pathlib import Path

from torchyard.client import MetricPoint, TorchyardError

# Loss curves span orders of magnitude early on; a log axis shows the late part of training too.
_LOG_SCALE = ("loss",)


def plot_metrics(points: list[MetricPoint], out: Path, title: str) -> Path:
    """Write a PNG with one subplot per metric name; train/X and eval/X share a panel."""
    try:
        import matplotlib
    except ImportError as exc:
        raise TorchyardError("--plot needs matplotlib: pip install matplotlib==3.11.2") from exc

    matplotlib.use("Agg")  # no display: a PNG file is the product
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for p in points:
        _, _, short = p.name.rpartition("/")
        xs, ys = series.setdefault(short, {}).setdefault(p.name, ([], []))
        xs.append(p.step)
        ys.append(p.value)
    if not series:
        raise ValueError("no metric points to plot")
    panels = sorted(series, key=lambda s: (s != "loss", s))
    cols = min(len(panels), 2)
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for name, (xs, ys) in sorted(series[panel].items()):
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, linewidth=1.5, label=name)
        if panel in _LOG_SCALE and all(v > 0 for _, ys in series[panel].values() for v in ys):
            ax.set_yscale("log")
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
