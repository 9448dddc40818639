"""One PNG per benchmark (matplotlib, Agg backend; imported only when a benchmark plots)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def _pyplot():  # -> matplotlib.pyplot
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    *,
    errors: dict[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    hline: float | None = None,
) -> None:
    """Bars per group, one color per series; optional min/max whiskers and a reference line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) * len(series) / 2 + 3), 4.2))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        yerr = None
        if errors and name in errors:
            lo, hi = errors[name]
            yerr = [
                [v - a for v, a in zip(values, lo, strict=True)],
                [b - v for v, b in zip(values, hi, strict=True)],
            ]
        ax.bar(xs, values, width, label=name, yerr=yerr, capsize=3)
    if hline is not None:
        ax.axhline(hline, color="gray", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lines(
    path: Path,
    title: str,
    xs: Sequence[float],
    series: dict[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    *,
    logx: bool = False,
    right: tuple[str, dict[str, Sequence[float]]] | None = None,
) -> None:
    """Line plot; ``right`` = (label, series) drawn dashed on a second y axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(xs), [str(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    handles, labels = ax.get_legend_handles_labels()
    if right is not None:
        label, rseries = right
        ax2 = ax.twinx()
        styles = ("--", ":", "-.")
        for i, (name, ys) in enumerate(rseries.items()):
            style = styles[i % len(styles)]
            ax2.plot(xs, ys, marker="s", linestyle=style, label=name, color=f"{0.2 + 0.3 * i:.1f}")
        ax2.set_ylabel(label)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
