"""Figures of runs' training curves (the series of ``sharpgrpo.diagnostics.curves``): one PNG per metric group
comparing runs (``plot_runs``, the ``sharpgrpo plot`` command), a single run's ``training_curves.png``
(``plot_training_curves``, written by ``train.py``), and the grad-norm variability table. matplotlib is imported
when a figure is drawn."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sharpgrpo.diagnostics.curves import load_log_history, metric_series, spike_summary
from sharpgrpo.evaluation.report import markdown_table

# (file name, title, exact keys, key prefixes)
METRIC_GROUPS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("reward", "Reward", ("reward",), ("rewards/",)),
    ("grad_norm", "Gradient norm", ("grad_norm",), ()),
    ("entropy", "Policy entropy", ("entropy", "kl"), ()),
    (
        "token_weight",
        "Token weights",
        tuple(f"token_weight/{s}" for s in ("mean", "std", "min", "max", "frac_at_lower", "frac_at_upper")),
        (),
    ),
    (
        "clipping",
        "Clipped fractions",
        ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "token_weight/frac_grad_clipped"),
        (),
    ),
    ("sharpness", "Sharpness probe", (), ("sharpness/",)),
    # every strategy's own metrics: strategy_keys() below, not a list of names
    ("strategy", "Strategy metrics", (), ()),
)
# Per-function reward statistics other than the mean only crowd the reward figure.
SKIPPED_SUFFIXES = ("/std",)
# Namespaces (``NAME/...``) that TRL, the trainer and the settings log whatever the strategy: the trainer's own
# metrics. A metric under any other namespace is a strategy's (``cw/*`` of cw_grpo, ``thr/*``, ``gtpo/*``,
# ``clip_cov/*``, ... and those of a strategy registered tomorrow), and gets a panel in ``strategy.png`` and in
# ``training_curves.png``: strategies log under a namespace of their own (the strategy registry holds no list of
# metric names), so the panels follow what a run logged.
TRAINER_NAMESPACES = ("rewards", "completions", "clip_ratio", "token_weight", "sharpness", "search", "sampling",
                      "tools", "train", "eval", "telemetry")  # fmt: skip


def run_labels(runs: Sequence[str | Path]) -> list[str]:
    """Folder names, with parents added where two runs would share a label."""
    paths = [Path(r).resolve() for r in runs]
    paths = [p.parent if p.is_file() else p for p in paths]
    labels = [p.name for p in paths]
    depth = 1
    while len(set(labels)) < len(labels) and depth < 5:
        depth += 1
        labels = ["/".join(p.parts[-depth:]) for p in paths]
    return labels


def group_keys(histories: Sequence[list[dict[str, Any]]], keys: Sequence[str], prefixes: Sequence[str]) -> list[str]:
    """The group's keys that at least one run logged with a finite value, exact keys first."""
    present: set[str] = set()
    for history in histories:
        for entry in history:
            for key, value in entry.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    present.add(key)
    found = [k for k in keys if k in present]
    for prefix in prefixes:
        found += sorted(
            k for k in present if k.startswith(prefix) and k not in found and not k.endswith(SKIPPED_SUFFIXES)
        )
    return found


def strategy_keys(histories: Sequence[list[dict[str, Any]]]) -> list[str]:
    """The strategies' metrics the runs logged with a finite value: every ``NAMESPACE/name`` key outside
    :data:`TRAINER_NAMESPACES`, sorted (a strategy's metrics side by side)."""
    candidates = set()
    for history in histories:
        for entry in history:
            for key in entry:
                namespace, slash, _ = key.partition("/")
                if slash and namespace not in TRAINER_NAMESPACES and not key.endswith(SKIPPED_SUFFIXES):
                    candidates.add(key)
    return group_keys(histories, sorted(candidates), ())


def ema(values: Sequence[float], alpha: float) -> list[float]:
    """Exponential moving average with weight ``alpha`` on the newest value (alpha = 1: no smoothing)."""
    smoothed, current = [], None
    for value in values:
        current = value if current is None else alpha * value + (1 - alpha) * current
        smoothed.append(current)
    return smoothed


def _plot_group(
    path: Path,
    title: str,
    keys: Sequence[str],
    histories: Sequence[list[dict[str, Any]]],
    labels: Sequence[str],
    smooth: float,
    spike_factor: float,
) -> list[str]:
    """Draw one panel per key into ``path``; return the keys of the panels drawn (those holding a curve)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    columns = min(3, len(keys))
    rows = math.ceil(len(keys) / columns)
    width = 5.2 * columns if columns > 1 else 8.0
    fig, axes = plt.subplots(rows, columns, figsize=(width, 3.6 * rows + (0.6 if columns == 1 else 0)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, key in enumerate(keys):
        ax = axes[index // columns][index % columns]
        for run_index, (history, label) in enumerate(zip(histories, labels, strict=True)):
            steps, values = metric_series(history, key)
            if not steps:
                continue
            color = colors[run_index % len(colors)]
            if key == "grad_norm":
                summary = spike_summary(values, spike_factor)
                label = f"{label} (std {summary['std']:.3g}, max {summary['max']:.3g}, spikes {summary['spikes']})"
            if 0 < smooth < 1:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(steps, ema(values, smooth), color=color, label=label, linewidth=1.6)
            else:
                ax.plot(
                    steps, values, color=color, label=label, linewidth=1.4, marker="." if len(steps) < 30 else None
                )
            if key == "grad_norm":
                threshold = spike_factor * summary["median"]
                spikes = [(s, v) for s, v in zip(steps, values) if v > threshold]
                if spikes:
                    ax.scatter(*zip(*spikes), color=color, marker="x", s=40, zorder=3)
                ax.axhline(threshold, color=color, linestyle=":", linewidth=0.8)
        spike_note = f"  (x: spike above {spike_factor:g} x median, dotted line)"
        ax.set_title(key + (spike_note if key == "grad_norm" else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for index in range(len(keys), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    drawn = [ax.get_title().split("  (")[0] for row in axes for ax in row if ax.get_visible() and ax.lines]
    plt.close(fig)
    return drawn


def plot_runs(
    runs: Sequence[str | Path],
    output: str | Path,
    labels: Sequence[str] | None = None,
    smooth: float = 0.0,
    spike_factor: float = 3.0,
) -> dict[str, Any]:
    """Write the PNGs and the grad-norm summary for ``runs`` into ``output``; return ``{"files", "grad_norm",
    "panels"}`` (``panels``: each PNG's file name -> the metric of each panel drawn in it).

    Args:
        runs: run folders (or ``trainer_state.json`` files).
        output: folder for the files (created).
        labels: legend names (default: folder names).
        smooth: EMA weight of the newest value in (0, 1) to overlay a smoothed curve; 0 plots raw values only.
        spike_factor: a grad-norm value above ``spike_factor`` x the run's median counts as a spike.
    """
    import matplotlib

    matplotlib.use("Agg")
    if not runs:
        raise ValueError("Give at least one run folder.")
    labels = list(labels) if labels else run_labels(runs)
    if len(labels) != len(runs):
        raise ValueError("Give one label per run.")
    histories = [load_log_history(run) for run in runs]
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    files = []
    panels = {}
    for name, title, keys, prefixes in METRIC_GROUPS:
        present = group_keys(histories, keys, prefixes) if name != "strategy" else strategy_keys(histories)
        if name == "reward" and len([k for k in present if k.startswith("rewards/")]) == 1:
            present = [k for k in present if not k.startswith("rewards/")]  # one function: the same curve as reward
        if present:
            path = output / f"{name}.png"
            panels[path.name] = _plot_group(path, title, present, histories, labels, smooth, spike_factor)
            files.append(path)
    summaries = {}
    for label, history in zip(labels, histories, strict=True):
        summaries[label] = spike_summary(metric_series(history, "grad_norm")[1], spike_factor)
    (output / "grad_norm_summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    (output / "grad_norm_summary.md").write_text(grad_norm_markdown(summaries, spike_factor))
    files += [output / "grad_norm_summary.json", output / "grad_norm_summary.md"]
    return {"files": [str(f) for f in files], "grad_norm": summaries, "panels": panels}


TRAINING_CURVE_KEYS = (
    "reward",
    "grad_norm",
    "token_weight/mean",
    "token_weight/std",
    "token_weight/min",
    "token_weight/max",
    "token_weight/frac_at_lower",
    "token_weight/frac_at_upper",
    "token_weight/frac_grad_clipped",
)


def training_curve_keys(history: list[dict[str, Any]]) -> list[str]:
    """The panels of ``training_curves.png``: reward, grad norm, the token-weight statistics and every metric of the
    run's strategies (:func:`strategy_keys`), those the run logged."""
    return group_keys([history], TRAINING_CURVE_KEYS, ()) + strategy_keys([history])


def plot_training_curves(run: str | Path, output: str | Path, label: str | None = None) -> Path | None:
    """One PNG of a single run: reward, grad norm, the token-weight statistics and the strategies' own metrics per
    step (what ``sharpgrpo train`` writes as ``training_curves.png``); keys the run did not log are left out.
    Returns the path, or None when nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    history = load_log_history(run)
    keys = training_curve_keys(history)
    if not keys:
        return None
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    _plot_group(output, "Training curves", keys, [history], [label or run_labels([run])[0]], 0.0, 3.0)
    return output


def grad_norm_markdown(summaries: dict[str, dict[str, Any]], spike_factor: float) -> str:
    def number(value):
        return "-" if value is None else f"{value:.4g}"

    headers = ["Run", "Steps", "Mean", "Std", "CV", "Median", "Max", f"Spikes (> {spike_factor:g} x median)"]
    rows = [
        [label, s["steps"], number(s["mean"]), number(s["std"]), number(s["cv"]), number(s["median"]),
         number(s["max"]), s["spikes"]]
        for label, s in summaries.items()
    ]  # fmt: skip
    return "Gradient-norm variability per run (population std; CV = std / mean).\n\n" + markdown_table(headers, rows)
