"""The report of a comparison (``sharpgrpo compare``): the finished runs' metrics (``sharpgrpo.compare.stats``)
aggregated into ``summary.json``, ``report.md`` (per strategy the mean and Student-t interval over seeds, and the
paired difference against the first strategy, the baseline) and ``reward.png`` / ``grad_norm.png`` / ``entropy.png``
(mean over seeds with its band)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sharpgrpo.compare.runs import Run, shown_path
from sharpgrpo.compare.stats import METRICS, curve_band, reward_range, run_metrics, summarize
from sharpgrpo.diagnostics.curve_plots import ema
from sharpgrpo.diagnostics.curves import load_log_history, metric_series
from sharpgrpo.evaluation.report import markdown_table


def collect(runs: list[Run], spike_factor: float) -> tuple[dict[str, dict[int, dict]], dict[str, dict[int, list]]]:
    """``({label: {seed: run_metrics}}, {label: {seed: log_history}})`` of the finished runs."""
    per_run: dict[str, dict[int, dict]] = {}
    histories: dict[str, dict[int, list]] = {}
    for run in runs:
        per_run.setdefault(run.spec.label, {})
        histories.setdefault(run.spec.label, {})
        if run.status not in ("done", "skipped"):
            continue
        history = load_log_history(run.directory)
        eval_result = (
            json.loads(run.eval_output.read_text()) if run.eval_output and run.eval_output.is_file() else None
        )
        per_run[run.spec.label][run.seed] = run_metrics(history, eval_result, spike_factor)
        histories[run.spec.label][run.seed] = history
    return per_run, histories


def _number(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}g}"


def _interval(stats: dict[str, Any]) -> str:
    if stats["mean"] is None:
        return "-"
    if stats["low"] is None:
        return f"{_number(stats['mean'])} (n={stats['n']})"
    clipped = stats.get("clipped") or ()
    low = _number(stats["low"]) + ("*" if "low" in clipped else "")
    high = _number(stats["high"]) + ("*" if "high" in clipped else "")
    return f"{_number(stats['mean'])} [{low}, {high}]"


def _range_note(summary: dict[str, Any]) -> str:
    """What the intervals are clipped to, and why (few seeds make a t interval wider than the quantity's range)."""
    rewards = summary.get("ranges", {}).get("final_reward")
    reward = f"[{_number(rewards[0])}, {_number(rewards[1])}], the range of the logged per-step rewards" if rewards \
        else "not clipped (no reward logged)"  # fmt: skip
    seeds = [len(entry["seeds"]) for entry in summary["strategies"].values() if entry["seeds"]]
    few = (f" With {min(seeds)} seeds a Student-t interval is wide (2 seeds: 12.7 standard errors either side at 95%)."
           if seeds and min(seeds) < 4 else "")  # fmt: skip
    return (f"Intervals are clipped to the quantity's range, a clipped end marked `*`: rewards to {reward}; grad "
            f"norms, spikes, entropies, weights and seconds to >= 0; accuracies to [0, 1]; paired differences of a "
            f"bounded quantity to +-its range's width.{few}")


def report_markdown(summary: dict[str, Any], runs: list[Run], command: str) -> str:
    """``report.md``: the command, the runs, the per-strategy table and the paired-difference table."""
    confidence = round(100 * summary["confidence"])
    names = summary["metrics"]
    titles = {n: METRICS[n][0] if n in METRICS else n for n in names}
    lines = [
        "# Strategy comparison",
        "",
        f"Command: `{command}`",
        "",
        (
            f"Per strategy: mean over seeds [{confidence}% Student-t interval]. Baseline for paired differences: "
            f"**{summary['baseline']}**. Spikes: grad norm above {summary['spike_factor']:g} x the run's median."
        ),
        "",
        _range_note(summary),
        "",
    ]
    failed = [r for r in runs if r.status == "failed"]
    missing = [r for r in runs if r.status == "missing"]
    stopped = [r for r in runs if r.status in ("interrupted", "cancelled")]
    lines += [f"Runs: {len(runs)} planned, {sum(r.status == 'done' for r in runs)} run now, "
              f"{sum(r.status == 'skipped' for r in runs)} reused, {len(failed)} failed"
              + (f", {len(missing)} not run (--report_only)" if missing else "")
              + (f", {len(stopped)} stopped (interrupted)" if stopped else "") + ".", ""]  # fmt: skip
    if missing:
        lines += ["Not run: " + ", ".join(f"{r.spec.label} seed {r.seed}" + (f" ({r.error})" if r.error else "")
                                          for r in missing), ""]  # fmt: skip
    if stopped:
        lines += [
            "**Partial report: the comparison was interrupted.** Stopped while running: "
            + (", ".join(f"{r.spec.label} seed {r.seed}" for r in stopped if r.status == "interrupted") or "none")
            + "; never started: "
            + (", ".join(f"{r.spec.label} seed {r.seed}" for r in stopped if r.status == "cancelled") or "none")
            + ". Re-running the same command resumes (finished runs are reused).",
            "",
        ]
    if failed:
        lines += ["Failed runs (left out of the statistics):", ""]
        lines += [f"- {r.spec.label} seed {r.seed}: {r.error} (log: `{shown_path(r.log)}`)" for r in failed]
        lines.append("")
    lines += ["## Per strategy", ""]
    headers = ["Strategy", "Seeds"] + [titles[n] for n in names]
    rows = [
        [label, len(entry["seeds"])] + [_interval(entry["metrics"][n]) for n in names]
        for label, entry in summary["strategies"].items()
    ]
    lines += [markdown_table(headers, rows), ""]
    if summary["differences"]:
        lines += [
            f"## Paired difference vs {summary['baseline']}",
            "",
            (
                f"Strategy minus baseline on the same seed: mean [{confidence}% interval], then wins / paired seeds "
                "(a win is a better value: higher reward, accuracy and entropy; lower grad norm, CV, spikes and time)."
            ),
            "",
        ]
        headers = ["Strategy"] + [titles[n] for n in names]
        rows = []
        for label, differences in summary["differences"].items():
            cells = []
            for n in names:
                d = differences[n]
                cells.append("-" if d["n"] == 0 else f"{_interval(d)}; {d['wins']}/{d['n']}")
            rows.append([label] + cells)
        lines += [markdown_table(headers, rows), ""]
    return "\n".join(lines)


MIN_RUNS_FOR_BAND = 3  # below it the plot shows each run instead of a Student-t band


def clipped_band(
    series: list[tuple[list[int], list[float]]], confidence: float
) -> tuple[list[int], list[float], list[float | None], list[float | None]]:
    """``curve_band`` with the interval clipped to the range the runs' values take (over all their steps): a band
    cannot claim a reward the metric never reached (with 2 seeds a 95% band spanned -2 to 4 for a reward in [0, 1])."""
    steps, means, lows, highs = curve_band(series, confidence)
    values = [v for _, run in series for v in run if v is not None]
    if not values:
        return steps, means, lows, highs
    low_end, high_end = min(values), max(values)

    def clip(value):
        return None if value is None else min(max(value, low_end), high_end)

    return steps, means, [clip(v) for v in lows], [clip(v) for v in highs]


def plot_bands(
    histories: dict[str, dict[int, list]], key: str, path: Path, title: str, confidence: float, smooth: float = 0.0
) -> bool:
    """Mean over seeds per step with its Student-t band, one line per strategy (``sharpgrpo plot`` conventions);
    ``smooth`` in (0, 1) first smooths each run's curve with ``curve_plots.ema`` (0: raw values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8.0, 4.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(histories) > len(colors):  # one colour per strategy: tab20's pairs, dark ones first
        tab20 = plt.get_cmap("tab20").colors
        colors = list(tab20[0::2]) + list(tab20[1::2])
    drawn = False
    for index, (label, runs) in enumerate(histories.items()):
        series = [metric_series(history, key) for history in runs.values()]
        series = [s for s in series if s[0]]
        if 0 < smooth < 1:
            series = [(steps, ema(values, smooth)) for steps, values in series]
        steps, means, lows, highs = clipped_band(series, confidence)
        if not steps:
            continue
        color = colors[index % len(colors)]
        ax.plot(steps, means, color=color, linewidth=1.4, label=f"{label} (n={len(series)})")
        if len(series) >= MIN_RUNS_FOR_BAND:
            ax.fill_between(steps, lows, highs, color=color, alpha=0.2, linewidth=0)
        else:  # the runs themselves: with 2 seeds the t interval is 12.7 standard errors wide
            for run_steps, values in series:
                ax.plot(run_steps, values, color=color, linewidth=0.6, alpha=0.45)
        drawn = True
    if drawn:
        note = f", EMA {smooth:g} per run" if 0 < smooth < 1 else ""
        shown = (f"{round(100 * confidence)}% band clipped to the runs' range (thin lines: the runs where fewer than "
                 f"{MIN_RUNS_FOR_BAND} seeds)")  # fmt: skip
        ax.set_title(f"{title}: mean over seeds,\n{shown}{note}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def write_report(
    runs: list[Run], output: Path, command: str, spike_factor: float = 3.0, confidence: float = 0.95,
    smooth: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """Aggregate the finished runs into ``summary.json``, ``report.md`` and the band plots; return the summary."""
    per_run, histories = collect(runs, spike_factor)
    baseline = runs[0].spec.label
    ranges = reward_range([h for runs in histories.values() for h in runs.values()])
    summary = summarize(per_run, baseline, confidence, ranges)
    summary["ranges"] = {name: list(bounds) for name, bounds in ranges.items()}
    summary["spike_factor"] = spike_factor
    summary["command"] = command
    summary["runs"] = [
        {"strategy": r.spec.label, "seed": r.seed, "status": r.status, "directory": shown_path(r.directory),
         "log": shown_path(r.log), "error": r.error, "metrics": per_run.get(r.spec.label, {}).get(r.seed)}
        for r in runs
    ]  # fmt: skip
    output.mkdir(parents=True, exist_ok=True)
    (output / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (output / "report.md").write_text(report_markdown(summary, runs, command))
    plots = []
    for key, title in (("reward", "Reward"), ("grad_norm", "Gradient norm"), ("entropy", "Policy entropy")):
        if plot_bands(histories, key, output / f"{key}.png", title, confidence, smooth):
            plots.append(str(output / f"{key}.png"))
    summary["plots"] = plots
    return summary
