"""Statistics of a multi-seed comparison (``sharpgrpo compare``): per-run metrics from a run's logs, the
mean and Student-t interval over seeds, and the paired difference against a baseline. Pure Python, no scipy.

Per-run metrics (:func:`run_metrics`):

* ``final_reward``: mean reward of the last 10% of logged steps (at least one step);
* ``reward_auc``: area under the reward curve (trapezoid over steps) divided by the step span, i.e. the mean reward
  over training, comparable between runs of different lengths;
* ``grad_norm_mean`` / ``grad_norm_cv`` / ``grad_norm_spikes``: :func:`sharpgrpo.diagnostics.curves.spike_summary`
  of the logged ``grad_norm`` (the quantity of GRPO-SG Figure 1 / TR-GRPO Figure 3; a spike is a value above
  ``spike_factor`` x the run's median, as in ``sharpgrpo plot``);
* ``final_entropy``: mean policy entropy over the last 10% of logged steps;
* ``entropy_auc``: the same area as ``reward_auc`` under the entropy curve (the mean entropy over training: the
  quantity of the entropy-collapse claims, less noisy than its last steps);
* ``seconds_per_step``: mean logged ``step_time`` (else ``train_runtime`` / steps);
* ``eval_accuracy`` (and ``eval_pass@k``): from the evaluation JSON of ``sharpgrpo eval`` when there is one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from sharpgrpo.diagnostics.curves import metric_series, spike_summary

FINAL_FRACTION = 0.1
# name -> (description, better direction: +1 higher is better, -1 lower is better)
METRICS: dict[str, tuple[str, int]] = {
    "final_reward": ("Final reward (mean of last 10% of steps)", +1),
    "reward_auc": ("Reward AUC (mean reward over training)", +1),
    "grad_norm_mean": ("Grad-norm mean", -1),
    "grad_norm_cv": ("Grad-norm CV (std / mean)", -1),
    "grad_norm_spikes": ("Grad-norm spikes", -1),
    "final_entropy": ("Final entropy (mean of last 10% of steps)", +1),
    "entropy_auc": ("Entropy AUC (mean entropy over training)", +1),
    "weight_mean": ("Token-weight mean over valid tokens (mean over steps)", +1),
    "seconds_per_step": ("Seconds per step", -1),
    "eval_accuracy": ("Eval accuracy", +1),
}


# ----------------------------------------------------------------------------------------------------------------
# Student t
# ----------------------------------------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise RuntimeError("Incomplete beta continued fraction did not converge.")


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}.")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}.")
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}.")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    if q == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < q:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean over seeds and its two-sided Student-t interval: ``{n, mean, std, low, high}`` (sample std, n - 1
    degrees of freedom; ``low``/``high``/``std`` are None with fewer than two values)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "low": None, "high": None}
    mean = statistics.fmean(values)
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "low": None, "high": None}
    std = statistics.stdev(values)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "low": mean - half, "high": mean + half}


def paired_difference(
    values: Mapping[Any, float | None],
    baseline: Mapping[Any, float | None],
    direction: int = +1,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """``values - baseline`` over the seeds both have (finite), with :func:`mean_interval`, the number of seeds the
    strategy wins (difference > 0 when ``direction`` is +1, < 0 when -1) and ties."""
    seeds = [
        s
        for s in values
        if s in baseline
        and values[s] is not None
        and baseline[s] is not None
        and math.isfinite(values[s])
        and math.isfinite(baseline[s])
    ]
    differences = [values[s] - baseline[s] for s in seeds]
    result = mean_interval(differences, confidence)
    result["seeds"] = list(seeds)
    result["wins"] = sum(direction * d > 0 for d in differences)
    result["ties"] = sum(d == 0 for d in differences)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Per-run metrics
# ----------------------------------------------------------------------------------------------------------------
def final_mean(values: Sequence[float], fraction: float = FINAL_FRACTION) -> float | None:
    """Mean of the last ``ceil(fraction * len(values))`` values (at least one); None when empty."""
    if not values:
        return None
    count = max(1, math.ceil(fraction * len(values)))
    return statistics.fmean(values[-count:])


def curve_auc(steps: Sequence[float], values: Sequence[float]) -> float | None:
    """Trapezoidal area under ``values`` over ``steps`` divided by the step span (the curve's mean level); a single
    point gives its value, no point None."""
    if not values:
        return None
    if len(values) == 1 or steps[-1] == steps[0]:
        return statistics.fmean(values)
    area = sum((steps[i + 1] - steps[i]) * (values[i + 1] + values[i]) / 2.0 for i in range(len(values) - 1))
    return area / (steps[-1] - steps[0])


def eval_accuracy(result: Mapping[str, Any] | None) -> dict[str, float]:
    """``eval_accuracy`` (and ``eval_pass@k`` when sampled) from a ``sharpgrpo eval`` result: the summary's
    ``overall`` accuracy when it has one, else its own ``accuracy``, else the mean accuracy of its groups."""
    if not result:
        return {}
    summary = result.get("summary", result)
    for candidate in (summary.get("overall"), summary):
        if isinstance(candidate, Mapping) and isinstance(candidate.get("accuracy"), (int, float)):
            metrics = {"eval_accuracy": float(candidate["accuracy"])}
            for k, v in (candidate.get("pass@k") or {}).items():
                metrics[f"eval_pass@{k}"] = float(v)
            return metrics
    groups = [v["accuracy"] for v in summary.values() if isinstance(v, Mapping) and "accuracy" in v]
    groups = [g for g in groups if isinstance(g, (int, float))]
    return {"eval_accuracy": statistics.fmean(groups)} if groups else {}


def run_metrics(
    history: list[dict[str, Any]], eval_result: Mapping[str, Any] | None = None, spike_factor: float = 3.0
) -> dict[str, float | int | None]:
    """The per-run metrics of the module docstring from a run's log history (and evaluation result)."""
    steps, rewards = metric_series(history, "reward")
    _, grad_norms = metric_series(history, "grad_norm")
    entropy_steps, entropies = metric_series(history, "entropy")
    _, step_times = metric_series(history, "step_time")
    _, weight_means = metric_series(history, "token_weight/mean")  # weight strategies; cw_grpo's own name below
    weight_means = weight_means or metric_series(history, "cw/weight_mean")[1]
    spikes = spike_summary(grad_norms, spike_factor)
    if step_times:
        seconds = statistics.fmean(step_times)
    else:
        runtime = [e for e in history if "train_runtime" in e and e.get("step")]
        seconds = runtime[-1]["train_runtime"] / runtime[-1]["step"] if runtime else None
    metrics = {
        "steps": len(rewards),
        "final_reward": final_mean(rewards),
        "reward_auc": curve_auc(steps, rewards),
        "grad_norm_mean": spikes["mean"],
        "grad_norm_cv": spikes["cv"],
        "grad_norm_spikes": spikes["spikes"] if grad_norms else None,
        "final_entropy": final_mean(entropies),
        "entropy_auc": curve_auc(entropy_steps, entropies),
        "weight_mean": statistics.fmean(weight_means) if weight_means else None,
        "seconds_per_step": seconds,
    }
    metrics.update(eval_accuracy(eval_result))
    return metrics


# The range each metric can take, for clipping its interval (with 2 seeds a 95% Student-t interval is 12.7 standard
# errors wide: it claimed rewards above 1 and negative counts). None: no bound on that side. The rewards' range is
# the runs' own (reward_range: a mean of logged rewards cannot leave the range of the logged values), given to
# summarize() as ``ranges``.
METRIC_RANGES: dict[str, tuple[float | None, float | None]] = {
    "grad_norm_mean": (0.0, None),
    "grad_norm_cv": (0.0, None),
    "grad_norm_spikes": (0.0, None),
    "final_entropy": (0.0, None),
    "entropy_auc": (0.0, None),
    "weight_mean": (0.0, None),
    "seconds_per_step": (0.0, None),
    "eval_accuracy": (0.0, 1.0),
}
REWARD_METRICS = ("final_reward", "reward_auc")


def metric_range(name: str, ranges: Mapping[str, tuple[float | None, float | None]] | None = None):
    """``(low, high)`` bounds of a metric (either may be None): ``ranges`` first, then :data:`METRIC_RANGES`;
    ``eval_pass@k`` is a fraction like ``eval_accuracy``."""
    if ranges and name in ranges:
        return ranges[name]
    if name.startswith("eval_pass@"):
        return (0.0, 1.0)
    return METRIC_RANGES.get(name, (None, None))


def reward_range(histories) -> dict[str, tuple[float, float]]:
    """The reward metrics' range from the runs' logs: ``[min, max]`` of every logged per-step ``reward``."""
    values = [v for history in histories for v in metric_series(history, "reward")[1]]
    return {name: (min(values), max(values)) for name in REWARD_METRICS} if values else {}


def clip_interval(interval: dict[str, Any], low: float | None, high: float | None) -> dict[str, Any]:
    """``interval`` with ``low`` / ``high`` clipped to the bounds; ``clipped`` says which ends were (a list)."""
    clipped = []
    if interval.get("low") is not None and low is not None and interval["low"] < low:
        interval["low"] = low
        clipped.append("low")
    if interval.get("high") is not None and high is not None and interval["high"] > high:
        interval["high"] = high
        clipped.append("high")
    interval["clipped"] = clipped
    return interval


def metric_direction(name: str) -> int:
    """+1 when higher is better (rewards, accuracies, pass@k, entropy), -1 when lower is (grad norm, time)."""
    if name in METRICS:
        return METRICS[name][1]
    return +1


def summarize(
    per_run: Mapping[str, Mapping[int, Mapping[str, Any]]], baseline: str, confidence: float = 0.95,
    ranges: Mapping[str, tuple[float | None, float | None]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Per strategy label: ``{metric: mean_interval}`` over its seeds, and for every label but the baseline
    ``{metric: paired_difference vs baseline}``. Each interval is clipped to the metric's range
    (:func:`metric_range`; a paired difference of a metric bounded on both sides to +-(high - low)), and says which
    ends were clipped (``clipped``).

    Args:
        per_run: ``{label: {seed: run_metrics}}`` of the finished runs.
        baseline: the label the others are compared with.
        ranges: bounds that override :data:`METRIC_RANGES` (e.g. :func:`reward_range` of the runs' logs).
    """
    names: list[str] = []
    for runs in per_run.values():
        for metrics in runs.values():
            names += [k for k, v in metrics.items() if k != "steps" and k not in names and isinstance(v, (int, float))]
    ordered = [n for n in METRICS if n in names] + sorted(n for n in names if n not in METRICS)
    strategies: dict[str, Any] = {}
    for label, runs in per_run.items():
        strategies[label] = {
            "seeds": sorted(runs),
            "metrics": {n: clip_interval(mean_interval([m.get(n) for m in runs.values()], confidence),
                                         *metric_range(n, ranges)) for n in ordered},  # fmt: skip
        }
    differences: dict[str, Any] = {}
    base_runs = per_run.get(baseline, {})
    for label, runs in per_run.items():
        if label == baseline:
            continue
        differences[label] = {}
        for n in ordered:
            low, high = metric_range(n, ranges)
            span = high - low if low is not None and high is not None else None
            differences[label][n] = clip_interval(
                paired_difference(
                    {s: m.get(n) for s, m in runs.items()},
                    {s: m.get(n) for s, m in base_runs.items()},
                    metric_direction(n),
                    confidence,
                ),
                None if span is None else -span,
                span,
            )
    return {"baseline": baseline, "confidence": confidence, "metrics": ordered, "strategies": strategies,
            "differences": differences}  # fmt: skip


def curve_band(
    series: Sequence[tuple[Sequence[int], Sequence[float]]], confidence: float = 0.95
) -> tuple[list[int], list[float], list[float | None], list[float | None]]:
    """Per step logged by every run: the mean over runs and its Student-t interval ``(steps, mean, low, high)``."""
    if not series:
        return [], [], [], []
    common = set(series[0][0])
    for steps, _ in series[1:]:
        common &= set(steps)
    lookups = [dict(zip(steps, values)) for steps, values in series]
    out_steps, means, lows, highs = [], [], [], []
    for step in sorted(common):
        interval = mean_interval([lookup[step] for lookup in lookups], confidence)
        out_steps.append(step)
        means.append(interval["mean"])
        lows.append(interval["low"])
        highs.append(interval["high"])
    return out_steps, means, lows, highs
