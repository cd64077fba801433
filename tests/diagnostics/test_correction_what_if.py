"""The rollout correction's per-token telemetry columns and the what-if view of ``sharpgrpo tokens --what-if``.

* the strategies' declared columns (``TokenLossStrategy.columns`` / ``LossTerms.columns``) equal their own quantities
  (the factor they put on the loss, the metrics they log), and an undeclared column is refused;
* the what-if's computation (``token_factors``, the strategies' ``correction_factors``) against a direct float64 loop
  reference on random tensors, for every IS level and handling, batch normalisation, K1/K2/K3 token and sequence
  rejection and bypass mode;
* the what-if on a telemetry frame: per micro-batch of each process, against the same loop, with a control that
  the micro-batch grouping matters; bad settings and files refused in one line.

The end-to-end view on a real vLLM run's telemetry (page, legend, printed summary) is tests/with_vllm/
test_correction_telemetry.py.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from sharpgrpo.diagnostics.correction_what_if import WhatIfError, token_factors, what_if
from sharpgrpo.strategies import LossContext, LossTerms, TokenLossStrategy
from sharpgrpo.strategies.rollout_correction import RolloutCorrection, RolloutCorrectionBypass
from sharpgrpo.strategy_params import StrategyParams
from sharpgrpo.training.loss.terms import collect_loss_terms

SAFETY = 20.0


# --------------------------------------------------------------------------------------------------------------------
# float64 loop reference (verl's rollout_corr_helper semantics, written out per token and per sequence)
# --------------------------------------------------------------------------------------------------------------------
def loop_factors(old, sampling, mask, settings: dict, mode: str):
    """(weights, keep) as nested lists, one value per token, from plain Python floats."""
    rows, length = len(old), len(old[0])
    log_r = [[(old[i][t] - sampling[i][t]) if mask[i][t] else 0.0 for t in range(length)] for i in range(rows)]
    tokens = [[t for t in range(length) if mask[i][t]] for i in range(rows)]

    def clamp(x):
        return max(-SAFETY, min(SAFETY, x))

    def estimate(x, k):
        x = clamp(x)
        return {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[k]

    keep = [[1.0 if mask[i][t] else 0.0 for t in range(length)] for i in range(rows)]
    rs = settings.get("rollout_rs", "none")
    if rs != "none":
        options = rs.split(",")
        specs = str(settings["rollout_rs_threshold"]).split(",")
        specs = specs * len(options) if len(specs) == 1 else specs
        for option, spec in zip(options, specs, strict=True):
            k = option[-2:]
            if k == "k1":
                lower, upper = (float(v) for v in spec.split("_")) if "_" in spec else (1 / float(spec), float(spec))
            else:
                lower, upper = None, float(spec)

            def passes(value):
                if lower is None:
                    return value <= upper
                return math.log(lower) <= value <= math.log(upper)

            for i in range(rows):
                values = [estimate(log_r[i][t], k) for t in tokens[i]]
                if option.startswith("token"):
                    for t, value in zip(tokens[i], values, strict=True):
                        keep[i][t] *= float(passes(value))
                    continue
                if option.startswith("seq_sum"):
                    statistic = sum(values)
                elif option.startswith("seq_mean"):
                    statistic = sum(values) / len(values) if values else 0.0
                else:
                    statistic = max(values) if values else 0.0
                if not passes(statistic):
                    for t in tokens[i]:
                        keep[i][t] = 0.0
    if mode == "bypass":
        return [[math.exp(clamp(log_r[i][t])) for t in range(length)] for i in range(rows)], keep
    level = settings.get("rollout_is", "sequence")
    if level == "none":
        return None, keep
    weights = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        for t in tokens[i]:
            if level == "token":
                exponent = log_r[i][t]
            elif level == "sequence":
                exponent = sum(log_r[i][s] for s in tokens[i])
            else:
                exponent = sum(log_r[i][s] for s in tokens[i]) / len(tokens[i])
            w = math.exp(clamp(exponent))
            threshold = settings.get("rollout_is_threshold", 2.0)
            if settings.get("rollout_is_handling", "truncate") == "truncate":
                w = min(w, threshold)
            else:
                w = w if w <= threshold else 0.0
            weights[i][t] = w
    if settings.get("rollout_is_batch_normalize", False):
        if level == "token":
            values = [weights[i][t] for i in range(rows) for t in tokens[i]]
        else:
            values = [weights[i][tokens[i][0]] for i in range(rows) if tokens[i]]
        mean = sum(values) / max(len(values), 1)
        if mean > 1e-8:
            weights = [[w / mean for w in row] for row in weights]
    return weights, keep


def random_batch(seed: int, rows: int = 16, length: int = 9, spread: float = 0.3):
    generator = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(rows, length, generator=generator, dtype=torch.float64)
    sampling = old + spread * torch.randn(rows, length, generator=generator, dtype=torch.float64)
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    mask[0, 0] = 0.0  # a tool-masked token inside a completion
    mask[-1] = 0.0  # a row without loss tokens
    return old, sampling, mask


SETTINGS = [
    ("decoupled", {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_rs": "token_k3",
                   "rollout_rs_threshold": "0.01"}),
    ("decoupled", {"rollout_is": "sequence", "rollout_is_handling": "mask", "rollout_is_threshold": 2.0,
                   "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.9_1.1"}),
    ("decoupled", {"rollout_is": "geometric", "rollout_is_threshold": 1.2, "rollout_is_batch_normalize": True,
                   "rollout_rs": "seq_max_k2,token_k1", "rollout_rs_threshold": "0.2,0.5_2.0"}),
    ("decoupled", {"rollout_is": "token", "rollout_is_threshold": 1.3, "rollout_is_batch_normalize": True}),
    ("decoupled", {"rollout_is": "none", "rollout_rs": "seq_sum_k3", "rollout_rs_threshold": "0.5"}),
    ("bypass", {"rollout_rs": "token_k2", "rollout_rs_threshold": "0.02"}),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("mode", "settings"), SETTINGS)
def test_token_factors_match_a_float64_loop(seed, mode, settings):
    old, sampling, mask = random_batch(seed)
    factors = token_factors(old, sampling, mask, StrategyParams(**settings), mode)
    weights, keep = loop_factors(old.tolist(), sampling.tolist(), mask.tolist(), settings, mode)
    on = mask.bool()
    assert torch.equal(factors.keep[on], torch.tensor(keep, dtype=torch.float64)[on])
    expected = torch.tensor(weights, dtype=torch.float64) if weights is not None else mask
    torch.testing.assert_close(factors.weights[on], expected[on], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(factors.factor[on], (expected * torch.tensor(keep, dtype=torch.float64))[on],
                               rtol=1e-12, atol=1e-12)
    if "rollout_rs" in settings:  # power: the bounds act on these inputs (some tokens kept, some rejected)
        assert 0 < factors.keep[on].sum() < on.sum()


def test_no_correction_keeps_everything():
    old, sampling, mask = random_batch(0)
    factors = token_factors(old, sampling, mask, None, "decoupled")
    assert torch.equal(factors.factor, mask) and torch.equal(factors.keep, mask)


# --------------------------------------------------------------------------------------------------------------------
# The strategies' declared columns
# --------------------------------------------------------------------------------------------------------------------
def _context(old, sampling, mask):
    return LossContext(logps=old.clone().requires_grad_(), old_logps=old, advantages=torch.ones(old.shape[0], 1),
                       mask=mask, entropies=None, epsilon_low=0.2, epsilon_high=0.28, sampling_logps=sampling)


@pytest.mark.parametrize(("cls", "settings"), [
    (RolloutCorrection, {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_rs": "token_k1",
                         "rollout_rs_threshold": "0.8_1.25"}),
    (RolloutCorrection, {"rollout_is": "none", "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.02"}),
    (RolloutCorrectionBypass, {"rollout_rs": "token_k3", "rollout_rs_threshold": "0.01"}),
])
def test_declared_columns_are_the_strategys_own_quantities(cls, settings):
    old, sampling, mask = random_batch(3)
    old, sampling = old.float(), sampling.float()
    sampling[1, 2] = float("nan")  # a token vLLM could not score: ratio 1 (TRL's reading), never rejected
    mask = mask.float()
    name = cls.registered_name()
    strategy = cls(StrategyParams(**settings))
    terms, metrics, columns = collect_loss_terms([(name, strategy)], _context(old, sampling, mask))
    weighted = cls is RolloutCorrectionBypass or settings["rollout_is"] != "none"
    assert set(columns) == {f"{name}/loss_mask", f"{name}/loss_cap", *(f"{name}/{c}" for c in cls.columns)} | (
        {f"{name}/token_mask"} if weighted else set()) | (
        {f"{name}/epsilon_low", f"{name}/epsilon_high"} if cls is RolloutCorrectionBypass else set())
    on = mask.bool()
    weight, rejected = columns[f"{name}/is_weight"], columns[f"{name}/rejected"]
    # the factor the loss used is the weight before rejection; the rejected tokens leave its mask (and normaliser)
    factor = columns[f"{name}/token_mask"] if weighted else torch.ones_like(weight)
    torch.testing.assert_close(factor[on], weight[on])
    assert torch.equal(columns[f"{name}/loss_mask"][on], 1 - rejected[on])
    assert columns[f"{name}/mismatch_k1"][1, 2] == 0  # the unscored token: no mismatch
    # the same computation as the what-if view, from the same inputs
    factors = token_factors(old, sampling, mask, strategy.args, cls.mode)
    torch.testing.assert_close(weight[on], factors.weights[on])
    assert torch.equal(rejected[on], 1 - factors.keep[on])
    # their means over the loss tokens are the logged metrics
    n = mask.sum()
    torch.testing.assert_close((rejected * mask).sum() / n, metrics["rollout_corr/rejected_fraction"])
    torch.testing.assert_close((columns[f"{name}/mismatch_k1"] * mask).sum() / n, metrics["rollout_corr/kl"])
    torch.testing.assert_close((columns[f"{name}/mismatch_k3"] * mask).sum() / n, metrics["rollout_corr/k3_kl"])
    reference_k1 = torch.where(on & ~torch.isnan(sampling), sampling - old, torch.zeros_like(old))
    torch.testing.assert_close(columns[f"{name}/mismatch_k1"][on], reference_k1[on])
    assert 0 < rejected[on].sum() < on.sum()  # the bounds act on these inputs


def test_an_undeclared_column_is_refused_and_a_declared_one_is_described():
    class Undeclared(TokenLossStrategy):
        columns = {"declared": "a declared column"}

        def loss_terms(self, context):
            return LossTerms(columns={"declared": context.mask, "typo": context.mask}), {}

    old, sampling, mask = random_batch(0)
    with pytest.raises(ValueError, match=r"Strategy mine returned the per-token column\(s\) typo"):
        collect_loss_terms([("mine", Undeclared(None))], _context(old, sampling, mask))
    from sharpgrpo.training.telemetry.recorder import _pattern_help

    assert "K1" in _pattern_help("rollout_correction/mismatch_k1")
    assert "before rejection" in _pattern_help("rollout_correction/is_weight")
    assert "bypass" in _pattern_help("rollout_correction_bypass/is_weight")


# --------------------------------------------------------------------------------------------------------------------
# The what-if on a telemetry frame
# --------------------------------------------------------------------------------------------------------------------
def telemetry_frame(seed: int = 0):
    """A frame with the telemetry's columns the what-if reads: 2 processes x 2 micro-batches of ragged rows."""
    parts, row = [], 0
    for process in range(2):
        for micro_batch in range(2):
            old, sampling, mask = random_batch(seed + 10 * process + micro_batch, rows=4, length=7)
            lengths = [max(int(mask[i].nonzero().max()) + 1, 1) if mask[i].any() else 3 for i in range(4)]
            for i in range(4):
                for t in range(lengths[i]):
                    parts.append({"process": process, "micro_batch": micro_batch, "row": row + i, "position": t,
                                  "mask": int(mask[i, t]), "old_logp": np.float32(old[i, t]),
                                  "sampling_logp": np.float32(sampling[i, t])})
            row += 4
    return pd.DataFrame(parts)


RUN = {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_is_handling": "truncate",
       "rollout_is_batch_normalize": True, "rollout_rs": "none", "rollout_rs_threshold": None}
META = {"strategies": ["rollout_correction"], "strategy_params": {"rollout_correction": RUN}, "sampling_logps": True}


def reference_factor(frame, settings: dict | None, mode: str = "decoupled", grouped: bool = True):
    """The loop reference per micro-batch (or over the whole frame with ``grouped=False``), per frame row."""
    out = np.zeros(len(frame))
    keys = ["process", "micro_batch"] if grouped else [np.zeros(len(frame))]
    for _, part in frame.groupby(keys):
        rows = sorted(part["row"].unique())
        length = int(part["position"].max()) + 1
        grid = {name: [[0.0] * length for _ in rows] for name in ("old_logp", "sampling_logp", "mask")}
        for record in part.itertuples():
            for name in grid:
                grid[name][rows.index(record.row)][record.position] = float(getattr(record, name))
        if settings is None:
            weights, keep = None, grid["mask"]
        else:
            weights, keep = loop_factors(grid["old_logp"], grid["sampling_logp"], grid["mask"], settings, mode)
        for index, record in zip(part.index, part.itertuples(), strict=True):
            i, t = rows.index(record.row), record.position
            out[index] = (grid["mask"][i][t] if weights is None else weights[i][t]) * keep[i][t]
    return out


def test_what_if_on_a_frame_matches_the_loop_per_micro_batch():
    frame = telemetry_frame()
    changes = [("rollout_rs", "token_k3"), ("rollout_rs_threshold", "0.01"), ("rollout_is_threshold", 1.5)]
    shown, summary = what_if(frame, META, changes)
    new = {**RUN, "rollout_rs": "token_k3", "rollout_rs_threshold": "0.01", "rollout_is_threshold": 1.5}
    run_ref, new_ref = reference_factor(frame, RUN), reference_factor(frame, new)
    loss = frame["mask"].to_numpy() == 1
    np.testing.assert_allclose(shown["what_if/run_token_mask"][loss], run_ref[loss], rtol=1e-5)
    np.testing.assert_allclose(shown["what_if/token_mask"][loss], new_ref[loss], rtol=1e-5)
    change = (loss & (new_ref == 0)).astype(int) - (loss & (run_ref == 0)).astype(int)
    assert np.array_equal(shown["what_if/change"].to_numpy(), change)
    assert summary["only_what_if"] == int((change > 0).sum()) > 0 and summary["only_run"] == 0
    assert summary["loss_tokens"] == int(loss.sum()) and summary["dropped_run"] == 0
    # control: the batch-normalised weights of one batch over the whole frame are not those of the micro-batches
    whole = reference_factor(frame, new, grouped=False)
    assert not np.allclose(whole[loss], new_ref[loss], rtol=1e-3)


def test_what_if_of_a_run_without_correction_and_of_bypass():
    frame = telemetry_frame(5)
    loss = frame["mask"].to_numpy() == 1
    meta = {"strategies": ["grpo_sg"], "strategy_params": {"grpo_sg": {}}, "sampling_logps": True}
    shown, summary = what_if(frame, meta, [("rollout_is", "token"), ("rollout_is_handling", "mask")])
    expected = reference_factor(frame, {"rollout_is": "token", "rollout_is_handling": "mask"})
    np.testing.assert_allclose(shown["what_if/token_mask"][loss], expected[loss], rtol=1e-5)
    assert (shown["what_if/run_token_mask"][loss] == 1).all() and summary["run"] == "no correction"
    assert summary["only_what_if"] == int((expected[loss] == 0).sum()) > 0
    bypass = {"strategies": ["rollout_correction_bypass"], "sampling_logps": True,
              "strategy_params": {"rollout_correction_bypass": {"rollout_rs": "token_k1",
                                                                "rollout_rs_threshold": "0.8_1.25"}}}
    shown, summary = what_if(frame, bypass, [("rollout_rs", "none")])
    run_ref = reference_factor(frame, {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25"}, "bypass")
    assert summary["only_run"] == int((run_ref[loss] == 0).sum()) > 0 and summary["only_what_if"] == 0


@pytest.mark.parametrize(("meta", "changes", "message"), [
    ({**META, "sampling_logps": False}, [("rollout_rs", "token_k3")], "holds no sampling log-probabilities"),
    ({k: v for k, v in META.items() if k != "sampling_logps"}, [("rollout_rs", "token_k3")], "not a vLLM run"),
    (META, [("rollout_rs_treshold", "0.01")], "rollout_rs_treshold is not a rollout-correction field "
     r"\(did you mean rollout_rs_threshold\?\)"),
    (META, [("epsilon", 0.1)], "epsilon is not a rollout-correction field"),
    (META, [("rollout_rs", "token_k9"), ("rollout_rs_threshold", "0.1")], "rollout_rs="),
    (META, [("rollout_is_threshold", -1.0)], "rollout_is_threshold"),
    (META, [("rollout_rs", "token_k3")], "rollout_rs_threshold is empty"),
    ({**META, "strategies": ["rollout_correction_bypass"], "strategy_params": {}}, [("rollout_is", "token")],
     "the run's rollout_correction_bypass does not read rollout_is"),
    (META, [], "give at least one KEY=VALUE"),
])
def test_bad_what_if_is_refused_in_one_line(meta, changes, message):
    with pytest.raises(WhatIfError, match=message) as error:
        what_if(telemetry_frame(), meta, changes)
    assert "\n" not in str(error.value)


def test_a_run_without_sampling_logps_is_refused_in_one_line(tiny_model_path, tmp_path):
    """A real transformers-generation run's telemetry: sampling_logp repeats old_logp, and the file says so."""
    from helpers import binary_letters_reward, make_trainer, tiny_config

    from sharpgrpo.cli.tokens import main
    from sharpgrpo.diagnostics.telemetry import read_telemetry
    from sharpgrpo.validation import ConfigError

    run = tmp_path / "run"
    make_trainer(tiny_model_path, tiny_config(run, max_steps=1, token_telemetry=True),
                 reward_funcs=[binary_letters_reward]).train()
    frame, meta = read_telemetry(run / "telemetry" / "telemetry_000001.parquet")
    assert meta["sampling_logps"] is False and (frame["sampling_logp"] == frame["old_logp"]).all()
    with pytest.raises(WhatIfError, match="holds no sampling log-probabilities") as error:
        main(["--telemetry", str(run), "--what-if", "rollout_rs=token_k3", "--output", str(tmp_path / "out")])
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="--what-if: only with --telemetry"):
        main(["--prompts", str(tmp_path / "p.jsonl"), "--model", "sharpgrpo-tiny", "--what-if", "rollout_rs=none",
              "--output", str(tmp_path / "out2")])


def test_the_correction_columns_are_shaded_by_what_they_mean():
    """Weights around 1, the signed K1 and what-if change around 0, the K3 and the flags as levels; the legend of a
    change column lists each value drawn with its count (the page-level legend check on real vLLM telemetry:
    tests/with_vllm/test_correction_telemetry.py)."""
    from sharpgrpo.diagnostics.telemetry import column_kind, shading

    kinds = {name: column_kind(name) for name in (
        "rollout_correction/is_weight", "rollout_correction_bypass/is_weight", "what_if/is_weight",
        "what_if/token_mask", "rollout_correction/token_mask", "rollout_correction/mismatch_k1", "what_if/change",
        "rollout_correction/mismatch_k3", "rollout_correction/rejected", "weight", "advantage/thr", "entropy")}
    assert kinds == {
        "rollout_correction/is_weight": "around_one", "rollout_correction_bypass/is_weight": "around_one",
        "what_if/is_weight": "around_one", "what_if/token_mask": "around_one",
        "rollout_correction/token_mask": "around_one", "rollout_correction/mismatch_k1": "signed",
        "what_if/change": "signed", "rollout_correction/mismatch_k3": "level", "rollout_correction/rejected": "level",
        "weight": "around_one", "advantage/thr": "signed", "entropy": "level"}
    legend = [label for label, _, _ in shading([1, -1, 0, 1, 0, 1], "what_if/change").entries()]
    assert legend == ["what_if/change -1: 1", "what_if/change 0 (unchanged): 2", "what_if/change 1: 3"]
