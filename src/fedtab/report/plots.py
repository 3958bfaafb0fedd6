"""Plots written by the CLI and the benchmarks (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_sweep", "plot_tuning_curve", "plt", "save_figure", "figure_data_uri", "figure_png", "tuning_curve_figure",
           "metric_by_site_figure", "imputation_curve_figure"]


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it as PNG at ``path`` (parent folders created), close it.

    Returns the written path. Every fedtab and benchmark plot ends here, so figures
    never stay open in a long process.
    """
    out = Path(path)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def figure_png(fig: Any, *, dpi: int = 100) -> bytes:
    """Lay out ``fig``, render it as PNG bytes, close it."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def figure_data_uri(fig: Any, *, dpi: int = 100) -> str:
    """Lay out ``fig``, render it as PNG into a ``data:image/png;base64,...`` URI, close it.

    For self-contained HTML: the image travels inside the page, nothing is fetched.
    """
    return "data:image/png;base64," + base64.b64encode(figure_png(fig, dpi=dpi)).decode("ascii")


def tuning_curve_figure(curves: Sequence[Mapping[str, Any]], title: str = "") -> Any:
    """Validation score (left axis) and features kept (right axis) against the freedom degree.

    ``curves``: one mapping per tuning run with ``method``, ``curve`` (points
    ``{freedom_degree, score, kept}``) and the choice ``freedom_degree``, ``kept``,
    ``score``. Returns the open figure (write it with :func:`save_figure` or
    :func:`figure_data_uri`).
    """
    fig, ax = plt.subplots(figsize=(7, 4))
    ax2 = ax.twinx()
    for i, res in enumerate(curves):
        curve = sorted(res["curve"], key=lambda c: c["freedom_degree"])
        fds = [c["freedom_degree"] for c in curve]
        color = f"C{i}"
        method = res.get("method", "")
        ax.plot(fds, [c["score"] for c in curve], "o-", color=color, label=f"{method}: score")
        ax2.plot(fds, [c["kept"] for c in curve], "s:", color=color, alpha=0.5, label=f"{method}: kept")
        fd, score = res.get("freedom_degree"), res.get("score")
        if fd is not None and score is not None:
            ax.axvline(fd, color=color, ls="--", lw=1)
            ax.annotate(f"{method} → fd {fd:g}\n{res.get('kept')} kept, {score:.3f}", (fd, score),
                        textcoords="offset points", xytext=(5, -25 - 25 * i), fontsize=8, color=color)
    ax.set_xlabel("freedom degree")
    ax.set_ylabel("validation F1 (weighted)")
    ax2.set_ylabel("features kept")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=7, loc="lower right")
    if title:
        ax.set_title(title)
    return fig


def metric_by_site_figure(values: Mapping[str, Mapping[str, float | None]], metric: str,
                          intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None) -> Any:
    """Grouped bars: ``values[model][site]`` of one ``metric`` (missing values are left out), with
    ``intervals[model][site] = (low, high)`` drawn as error bars where given.

    Returns the open figure.
    """
    models = list(values)
    sites = list(dict.fromkeys(s for m in models for s in values[m]))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(sites) + 4.5), 3.6))
    width = 0.8 / max(len(models), 1)
    for i, m in enumerate(models):
        xs = [j + i * width for j, s in enumerate(sites) if values[m].get(s) is not None]
        ys = [values[m][s] for s in sites if values[m].get(s) is not None]
        ax.bar(xs, ys, width=width, label=m, color=f"C{i}")
        ci = (intervals or {}).get(m) or {}
        pts = [(x, y, ci[s]) for x, y, s in zip(xs, ys, [s for s in sites if values[m].get(s) is not None])
               if s in ci]
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], fmt="none", ecolor="#333", capsize=3, lw=1,
                        yerr=[[max(p[1] - p[2][0], 0) for p in pts], [max(p[2][1] - p[1], 0) for p in pts]])
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(sites))], sites)
    ax.set_ylabel(metric)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside, never on a bar
    return fig


def imputation_curve_figure(history: Sequence[Mapping[str, Any]], best_round: int | None = None) -> Any:
    """The imputer's training loss and validation RMSE (z-space) per FedAvg round, the kept round
    marked. ``history``: ``{round, train_loss, val_rmse}`` rows (``None`` values are gaps).
    Returns the open figure."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    rounds = [h.get("round") for h in history]
    for key, label in (("train_loss", "training loss (MSE, masked cells)"), ("val_rmse", "validation RMSE")):
        ax.plot(rounds, [float("nan") if h.get(key) is None else h[key] for h in history], "o-", ms=3, label=label)
    if best_round is not None:
        ax.axvline(best_round, color="#555", ls="--", lw=1, label=f"kept: round {best_round}")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("FedAvg round")
    ax.set_ylabel("z-space")
    ax.legend(fontsize=8)
    return fig


def plot_sweep(sweep: Sequence[dict[str, Any]], path: str | Path, *, title: str = "Feature Election sweep") -> Path:
    """Signal and noise features kept (bars) and F1 (line, right axis) against freedom degree.

    ``sweep`` rows need ``freedom_degree``, ``signal``, ``noise`` and optionally ``f1``.
    Returns the written path.
    """
    fds = [r["freedom_degree"] for r in sweep]
    x = range(len(fds))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sig = [r["signal"] for r in sweep]
    noise = [r["noise"] for r in sweep]
    ax.bar(x, sig, color="#2a9d8f", label="signal kept")
    ax.bar(x, noise, bottom=sig, color="#e76f51", label="noise kept")
    ax.set_xticks(list(x), [f"{f:g}" for f in fds])
    ax.set_xlabel("freedom degree")
    ax.set_ylabel("features kept")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if all("f1" in r for r in sweep):
        ax2 = ax.twinx()
        (line,) = ax2.plot(list(x), [r["f1"] for r in sweep], "o-", color="#264653", label="weighted F1 (FedAvg)")
        ax2.set_ylabel("weighted F1 on the sites' test splits")
        ax2.set_ylim(0, 1)
        handles.append(line)
        labels.append(line.get_label())
    ax.legend(handles, labels, loc="upper left", fontsize=8)
    return save_figure(fig, path, dpi=120)


def plot_tuning_curve(results: Sequence[Any] | Any, path: str | Path, title: str = "") -> Path:
    """Plot score and kept features against fd for one or more
    :class:`~fedtab.election.tuning.TuningResult` s; mark each choice.

    Writes a PNG at ``path`` (matplotlib, Agg backend) and returns the path.
    """
    if not isinstance(results, (list, tuple)):
        results = [results]
    runs = [{"method": r.method, "curve": r.curve(), "freedom_degree": r.freedom_degree, "kept": r.kept,
             "score": r.score} for r in results]
    return save_figure(tuning_curve_figure(runs, title), path)
