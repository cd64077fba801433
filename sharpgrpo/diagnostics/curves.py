"""Training logs of a run (``trainer_state.json``'s ``log_history``) as per-step series, and the grad-norm
variability the papers show in their gradient-norm figures (GRPO-SG Figure 1, TR-GRPO Figure 3: "lower variability
and fewer spikes")."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

TRAINER_STATE = "trainer_state.json"


def find_trainer_state(run: str | Path) -> Path:
    """``trainer_state.json`` of a run: the file itself, ``RUN/trainer_state.json``, or the one in the run's latest
    ``checkpoint-N`` folder."""
    run = Path(run)
    if run.is_file():
        return run
    if (run / TRAINER_STATE).is_file():
        return run / TRAINER_STATE
    checkpoints = sorted(
        (p for p in run.glob("checkpoint-*") if (p / TRAINER_STATE).is_file() and p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
    )
    if checkpoints:
        return checkpoints[-1] / TRAINER_STATE
    raise FileNotFoundError(
        f"No {TRAINER_STATE} in {run} or its checkpoint-* folders (the trainer writes it at save time or with "
        "trainer.save_state())."
    )


def load_log_history(run: str | Path) -> list[dict[str, Any]]:
    """The training log entries (those with a ``step``); evaluation entries (``eval_*``) are kept as logged."""
    path = find_trainer_state(run)
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON, truncated or corrupt ({error}).") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history", []), list):
        raise ValueError(f"{path}: not a trainer state (expected a JSON object with a `log_history` list).")
    return [entry for entry in state.get("log_history", []) if isinstance(entry, dict) and "step" in entry]


def metric_series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one logged metric, skipping entries without it and non-finite values."""
    steps, values = [], []
    for entry in history:
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(int(entry["step"]))
            values.append(float(value))
    return steps, values


def spike_summary(values: list[float], spike_factor: float = 3.0) -> dict[str, float | int | None]:
    """Variability of a series: mean, std (population), coefficient of variation, median, max, and the number of
    values above ``spike_factor`` x median (a spike)."""
    if not values:
        return {
            "steps": 0, "mean": None, "std": None, "cv": None, "median": None, "max": None, "spikes": 0,
            "spike_factor": spike_factor,
        }  # fmt: skip
    mean = statistics.fmean(values)
    std = statistics.pstdev(values)
    median = statistics.median(values)
    return {
        "steps": len(values),
        "mean": mean,
        "std": std,
        "cv": std / mean if mean else None,
        "median": median,
        "max": max(values),
        "spikes": sum(v > spike_factor * median for v in values),
        "spike_factor": spike_factor,
    }


def grad_norm_summary(run: str | Path, spike_factor: float = 3.0) -> dict[str, Any]:
    """:func:`spike_summary` of a run's logged ``grad_norm``."""
    _, values = metric_series(load_log_history(run), "grad_norm")
    return spike_summary(values, spike_factor)
