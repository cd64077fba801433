"""What another rollout-correction setting would have done to a telemetry step, without rerunning.

    sharpgrpo tokens --telemetry RUN_DIR --what-if rollout_rs=token_k3 --what-if rollout_rs_threshold=0.01 --output DIR

A vLLM run's per-token telemetry holds, for every completion token, the trainer's old log-probability ``old_logp``
and the sampling engine's ``sampling_logp``: all a rollout correction reads. From them, micro-batch by micro-batch
of each process (the file's ``process`` and ``micro_batch`` columns: batch normalisation and sequence statistics
run over the micro-batch the loss saw), this module recomputes what the correction did under the run's setting and
what it would do under the changed one, with the strategies' own computation
(``sharpgrpo.strategies.rollout_correction.correction_factors`` on ``rollout_log_ratio``; no second formula), in
the file's float32, the dtype the loss computed them in (a float64 recomputation would decide a bound differently
wherever the mismatch is at float32's rounding, as it is between vLLM and the trainer in float32).

The run's setting is the file's ``strategy_params`` of its rollout-correction strategy (``rollout_correction``:
decoupled, ``rollout_correction_bypass``: bypass); a vLLM run without one was not corrected (nothing dropped, weight
1), and its what-if starts from the config defaults (decoupled). A token is *dropped* where the correction's factor
on its policy term (``weights * keep``, the strategy's ``token_mask``) is 0: rejected by ``rollout_rs`` or masked
by ``rollout_is_handling=mask``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.strategies.rollout_correction import correction_factors, rollout_log_ratio

CORRECTIONS = {"rollout_correction": "decoupled", "rollout_correction_bypass": "bypass"}
PREFIX = "what_if/"
# The columns the view adds to the frame (``what_if/<name>``) and what each holds.
COLUMNS = {
    "is_weight": "the correction's weight before rejection under the what-if setting (1 without weights)",
    "rejected": "1 where the what-if setting's rejection bounds drop the token or its sequence",
    "token_mask": "the what-if setting's factor on the token's policy term (weights * keep)",
    "run_token_mask": "the run's own factor, recomputed the same way (1 for a run without a correction)",
    "change": "+1: dropped only under the what-if setting; -1: dropped only under the run's; 0: the same",
}


class WhatIfError(ValueError):
    """A what-if the file or the setting cannot give: one line naming the option."""

    names_itself = True


def correction_fields() -> tuple[str, ...]:
    """Every field a rollout correction reads (the union of the strategies' ``params``), in declaration order."""
    return tuple(dict.fromkeys(p for name in CORRECTIONS for p in STRATEGIES.get(name).params))


def parse_change(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--what-if`` -> (key, value as its field's type: float and bool fields parsed, string fields
    such as ``rollout_rs_threshold=0.01`` kept as written)."""
    import json

    from sharpgrpo.strategy_params import StrategyParams

    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise WhatIfError(f"--what-if {text!r}: expected KEY=VALUE, e.g. --what-if rollout_rs_threshold=0.01.")
    kind = next((str(f.type) for f in fields(StrategyParams) if f.name == key), "str")
    if kind.startswith("str"):
        return key, None if raw.lower() in ("null", "none") and "None" in kind else raw
    try:
        return key, json.loads(raw.lower() if kind == "bool" else raw)
    except json.JSONDecodeError:
        return key, raw  # the field's rule names it


def run_correction(meta: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """``(the run's correction strategy or None, its parameters as the file records them)``."""
    name = next((s for s in meta.get("strategies", []) if s in CORRECTIONS), None)
    return name, dict((meta.get("strategy_params") or {}).get(name) or {}) if name else {}


def what_if_settings(meta: dict[str, Any], changes: Sequence[tuple[str, Any]]):
    """``(strategy, mode, run settings or None, what-if settings)``: ``StrategyParams`` built from the run's recorded
    parameters (the config's defaults for the others) and ``changes`` on top, each value checked by its field's rule
    and the strategy's ``check_params``; ``WhatIfError`` (one line) for a key that is no correction field."""
    from sharpgrpo.strategy_params import StrategyParams
    from sharpgrpo.validation import ConfigError, did_you_mean

    name, recorded = run_correction(meta)
    strategy = name or "rollout_correction"
    allowed = correction_fields()
    for key, value in changes:
        if key not in allowed:
            raise WhatIfError(f"--what-if {key}={value}: {key} is not a rollout-correction field"
                              f"{did_you_mean(key, allowed)}; the fields are {', '.join(allowed)}.")
        if key not in STRATEGIES.get(strategy).params:
            raise WhatIfError(f"--what-if {key}={value}: the run's {strategy} does not read {key} (it reads "
                              f"{', '.join(STRATEGIES.get(strategy).params)}).")
    known = {f.name for f in fields(StrategyParams)}
    base = {key: value for key, value in recorded.items() if key in known}
    try:
        run = StrategyParams(**base) if name else None
        new = StrategyParams(**{**base, **dict(changes)})
        STRATEGIES.get(strategy).check_params(new)
    except (ConfigError, ValueError, TypeError) as error:
        raise WhatIfError(f"--what-if: {error}") from None
    return strategy, CORRECTIONS[strategy], run, new


@dataclass
class Factors:
    """What one correction setting does to each token, (B, T): ``weights`` before rejection (1 where the
    setting has none), ``keep`` {0, 1} (the rejection), ``factor = weights * keep`` (0: dropped)."""

    weights: torch.Tensor
    keep: torch.Tensor
    factor: torch.Tensor


def token_factors(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, settings: Any,
                  mode: str) -> Factors:
    """The correction of one micro-batch, (B, T) tensors in, as the strategy computes it in its loss:
    ``correction_factors(rollout_log_ratio(old, sampling, mask), mask, settings, mode)``; ``settings=None``: no
    correction (weights and keep are the mask)."""
    mask = mask.to(old_logps.dtype)
    if settings is None:
        return Factors(mask, mask, mask)
    weights, keep = correction_factors(rollout_log_ratio(old_logps, sampling_logps, mask), mask, settings, mode)
    weights = mask if weights is None else weights
    return Factors(weights, keep, weights * keep)


def _micro_batches(frame):
    """Per (process, micro_batch) of a frame with a 0-based range index: its tokens' positions in the frame and their
    (B, T) places in a right-padded batch."""
    for _, part in frame.groupby(["process", "micro_batch"], sort=True):
        rows = np.unique(part["row"].to_numpy())
        b = np.searchsorted(rows, part["row"].to_numpy())
        yield part.index.to_numpy(), b, part["position"].to_numpy().astype(np.int64), len(rows)


def what_if(frame, meta: dict[str, Any], changes: Sequence[tuple[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """``(frame with the what_if/* columns, summary)`` for one telemetry file's frame and ``changes`` (KEY, VALUE)
    pairs. ``WhatIfError`` for a file whose ``sampling_logp`` is not the sampling engine's (not a vLLM run)."""
    if not changes:
        raise WhatIfError("--what-if: give at least one KEY=VALUE, e.g. --what-if rollout_rs=token_k3.")
    if not meta.get("sampling_logps", False):
        raise WhatIfError("--what-if: this telemetry file holds no sampling log-probabilities (sampling_logp repeats "
                          "old_logp: not a vLLM run, or written before the file recorded them); a rollout correction "
                          "needs them.")
    strategy, mode, run, new = what_if_settings(meta, changes)
    frame = frame.reset_index(drop=True)
    columns = {name: np.zeros(len(frame), dtype=np.float64) for name in COLUMNS}
    for position, b, t, rows in _micro_batches(frame):
        shape = (rows, int(t.max()) + 1)
        tensors = {}
        for name in ("old_logp", "sampling_logp", "mask"):
            values = torch.zeros(shape, dtype=torch.float32)
            values[b, t] = torch.as_tensor(frame[name].to_numpy(dtype=np.float32)[position])
            tensors[name] = values
        ran = token_factors(tensors["old_logp"], tensors["sampling_logp"], tensors["mask"], run, mode)
        would = token_factors(tensors["old_logp"], tensors["sampling_logp"], tensors["mask"], new, mode)
        loss = tensors["mask"][b, t].numpy() == 1
        dropped_run = loss & (ran.factor[b, t].numpy() == 0)
        dropped_new = loss & (would.factor[b, t].numpy() == 0)
        columns["is_weight"][position] = would.weights[b, t].numpy()
        columns["rejected"][position] = (loss & (would.keep[b, t].numpy() == 0)).astype(np.float64)
        columns["token_mask"][position] = would.factor[b, t].numpy()
        columns["run_token_mask"][position] = ran.factor[b, t].numpy()
        columns["change"][position] = dropped_new.astype(np.float64) - dropped_run.astype(np.float64)
    for name, values in columns.items():
        frame[PREFIX + name] = values
    loss = frame["mask"].to_numpy() == 1
    change = columns["change"][loss]
    dropped_new = loss & (columns["token_mask"] == 0)
    dropped_run = loss & (columns["run_token_mask"] == 0)
    setting = ", ".join(f"{key}={value}" for key, value in changes)
    recorded = run_correction(meta)[1]
    summary = {
        "setting": setting, "strategy": strategy, "mode": mode,
        "run": (", ".join(f"{k}={v}" for k, v in recorded.items()) if run is not None else "no correction"),
        "loss_tokens": int(loss.sum()), "dropped_run": int(dropped_run.sum()),
        "dropped_what_if": int(dropped_new.sum()),
        "only_what_if": int((change > 0).sum()), "only_run": int((change < 0).sum()),
        "both": int((dropped_run & dropped_new).sum()),
        "mean_weight_run": float(columns["run_token_mask"][loss].mean()) if loss.any() else float("nan"),
        "mean_weight_what_if": float(columns["token_mask"][loss].mean()) if loss.any() else float("nan"),
    }
    return frame, summary


def summary_line(summary: dict[str, Any]) -> str:
    """The one printed line: the counts of tokens dropped only under each setting."""
    return (f"[sharpgrpo] what-if {summary['setting']} ({summary['strategy']}; the run's: {summary['run']}): of "
            f"{summary['loss_tokens']} loss tokens, {summary['only_what_if']} dropped only under the what-if, "
            f"{summary['only_run']} only under the run's setting, {summary['both']} under both; mean factor "
            f"{summary['mean_weight_run']:.4g} -> {summary['mean_weight_what_if']:.4g}")


def summary_html(summary: dict[str, Any]) -> str:
    """The page's paragraph on the what-if (shading by ``what_if/change``: orange +1, blue -1)."""
    import html

    return (f"<p><b>What if</b> {html.escape(summary['setting'])} ({html.escape(summary['strategy'])}; the run's "
            f"setting: {html.escape(summary['run'])}): of {summary['loss_tokens']} loss tokens, "
            f"<b>{summary['only_what_if']}</b> would be dropped only under the what-if setting (what_if/change +1), "
            f"<b>{summary['only_run']}</b> were dropped only under the run's (what_if/change -1), {summary['both']} "
            f"under both; mean factor on the policy term {summary['mean_weight_run']:.4g} (run) and "
            f"{summary['mean_weight_what_if']:.4g} (what-if). Recomputed from the file's old_logp and sampling_logp "
            f"with the strategy's own functions, per micro-batch; hover a token for its what_if/* values.</p>")
