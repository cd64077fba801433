"""The rollout-correction functions (sharpgrpo/strategies/rollout_correction.py) against verl's released ones, run
unchanged on shared inputs.

verl's released code is imported from its package (verl 0.9.1 on PyPI; installed as README.md's Development section,
"Tests against verl's released code", says; these tests skip with that reason where it is not installed), never
copied into the repository. The functions used, from ``verl/trainer/ppo/rollout_corr_helper.py`` of verl 0.9.1:
``compute_rollout_rejection_mask`` (lines 197-413), ``compute_rollout_correction_weights`` (lines 522-657, its ESS
from ``compute_is_metrics``, lines 660-783), ``compute_rollout_correction_and_rejection_mask`` (lines 786-901) and
``compute_offpolicy_metrics`` (lines 904-1010). Every comparison runs both sides in float64 on random
log-probabilities with ragged masks (one row without tokens), several seeds, to 1e-6. The geometric level and masked
(MIS) weights, which verl's released helper does not have, are checked against float64 loops, which always run.
Controls show each comparison can fail.
"""

from __future__ import annotations

import math

import pytest
import torch

from sharpgrpo.strategies import rollout_correction as rc

D = torch.float64
SEEDS = [0, 1, 2, 3, 4]
VERL_MISSING = "verl's released code is not installed: see docs/development.md, the verl reference line"


@pytest.fixture(scope="module")
def verl():
    """verl's released ``verl.trainer.ppo.rollout_corr_helper``, imported from the installed package, unchanged."""
    return pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason=VERL_MISSING)


def batch(seed: int, rows: int = 6, length: int = 9, spread: float = 0.15):
    """(train log-probs, rollout log-probs, ragged {0, 1} mask) in float64; row 1 has no tokens, row 0 all."""
    generator = torch.Generator().manual_seed(seed)
    train = torch.log_softmax(torch.randn(rows, length, 12, generator=generator, dtype=D), dim=-1)[..., 0]
    rollout = train + spread * torch.randn(rows, length, generator=generator, dtype=D)
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    lengths[0], lengths[1] = length, 0
    mask = (torch.arange(length) < lengths[:, None]).to(D)
    return train, rollout, mask


def close(ours, theirs, tol=1e-6):
    return abs(float(ours) - float(theirs)) <= tol * max(1.0, abs(float(theirs)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("batch_normalize", [False, True])
def test_importance_weights_match_verl(verl, seed, level, batch_normalize):
    train, rollout, mask = batch(seed, spread=0.25)
    log_r = rc.log_ratio(train, rollout)
    threshold = 1.2 if level == "token" else 1.3
    theirs, metrics = verl.compute_rollout_correction_weights(log_r, mask, rollout_is=level,
                                                               rollout_is_threshold=threshold,
                                                               rollout_is_batch_normalize=batch_normalize)
    ours = rc.importance_weights(log_r, mask, level, threshold, batch_normalize=batch_normalize)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-9)
    raw = rc.raw_importance_weights(log_r, mask, level)
    assert close(rc.effective_sample_size(raw, mask, threshold), metrics["rollout_is_eff_sample_size"])
    valid = raw[mask.bool()]
    assert (valid > threshold).any() and (valid < threshold).any(), "the truncation is exercised"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "options, threshold",
    [
        ("token_k1", "0.8_1.25"), ("token_k2", 0.01), ("token_k3", 0.008), ("seq_sum_k1", "0.5_2.0"),
        ("seq_sum_k2", 0.08), ("seq_sum_k3", 0.06), ("seq_mean_k1", 1.05), ("seq_mean_k2", 0.012),
        ("seq_mean_k3", 0.01), ("seq_max_k2", 0.03), ("seq_max_k3", 0.03), ("token_k1,seq_mean_k3", "0.8_1.25,0.01"),
        ("seq_sum_k1,token_k2,seq_sum_k1", 1.1),  # one threshold for both options, a repeated option
    ],
)
def test_rejection_mask_matches_verl(verl, seed, options, threshold):
    train, rollout, mask = batch(seed)
    log_r = rc.log_ratio(train, rollout)
    for option in rc.parse_rejection_options(options):  # no statistic sits on a bound (float rounding there is moot)
        lower, upper = rc.parse_rejection_thresholds([option], threshold if "," not in str(threshold) else str(
            threshold).split(",")[rc.parse_rejection_options(options).index(option)])[option]
        statistic = rc.rejection_statistic(log_r, mask, option)
        bounds = [math.log(lower), math.log(upper)] if lower is not None else [upper]
        assert min((statistic - b).abs().min().item() for b in bounds) > 1e-9
    theirs, metrics = verl.compute_rollout_rejection_mask(log_r, mask, rollout_rs=options,
                                                          rollout_rs_threshold=threshold)
    ours = rc.rejection_mask(log_r, mask, options, threshold)
    assert torch.equal(ours, theirs.to(D))
    token_fraction, sequence_fraction = rc.rejected_fractions(ours, mask)
    assert close(token_fraction, metrics["rollout_rs_masked_fraction"])
    assert close(sequence_fraction, metrics["rollout_rs_seq_masked_fraction"])


def test_rejection_cases_have_power():
    """Across the seeds, each option both keeps and rejects some tokens of the shared inputs (else equal masks prove
    nothing)."""
    for option, threshold in [("token_k1", "0.8_1.25"), ("seq_sum_k1", "0.5_2.0"), ("seq_mean_k3", 0.01),
                              ("seq_max_k2", 0.03), ("token_k3", 0.008)]:
        kept = [rc.rejection_mask(rc.log_ratio(*batch(seed)[:2]), batch(seed)[2], option, threshold) for seed in SEEDS]
        valid = sum(batch(seed)[2].sum() for seed in SEEDS)
        total_kept = sum(k.sum() for k in kept)
        assert 0 < total_kept < valid, option


@pytest.mark.parametrize("seed", SEEDS)
def test_diagnostics_match_verl(verl, seed):
    train, rollout, mask = batch(seed, spread=0.3)
    theirs = verl.compute_offpolicy_metrics(old_log_prob=train, rollout_log_prob=rollout, response_mask=mask)
    ours = rc.mismatch_diagnostics(train, rollout, mask)
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        assert close(ours[name], value), (name, float(ours[name]), value)


def test_full_pipeline_matches_verl_and_controls_differ(verl):
    """verl's one-call interface (IS + RS + diagnostics) against the pieces; swapping the two policies (a control)
    changes the weights, the mask and the KL, so the comparisons above have power."""
    train, rollout, mask = batch(7, spread=0.3)
    proto, kept, metrics = verl.compute_rollout_correction_and_rejection_mask(
        train, rollout, mask, rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_sum_k1",
        rollout_rs_threshold="0.5_2.0")  # verl's decoupled_seq_is_rs preset
    preset = rc.PRESETS["decoupled_seq_is_rs"]
    log_r = rc.log_ratio(train, rollout)
    weights = rc.importance_weights(log_r, mask, preset.rollout_is, preset.is_threshold)
    keep = rc.rejection_mask(log_r, mask, preset.rollout_rs, preset.rs_threshold)
    torch.testing.assert_close(weights, proto.batch["rollout_is_weights"], rtol=1e-6, atol=1e-9)
    assert torch.equal(keep * mask, kept.to(D))
    assert close(rc.mismatch_diagnostics(train, rollout, mask)["kl"], metrics["rollout_corr/kl"])
    swapped_log_r = rc.log_ratio(rollout, train)
    assert not torch.allclose(rc.importance_weights(swapped_log_r, mask, "sequence", 2.0), weights)
    assert not close(rc.mismatch_diagnostics(rollout, train, mask)["kl"], metrics["rollout_corr/kl"])
    assert not torch.equal(rc.importance_weights(log_r, mask, "token", 2.0), weights)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("handling", ["truncate", "mask"])
def test_geometric_and_masked_weights_against_loops(seed, handling):
    """w_i = exp(clamp(mean_t log r_it, +-20)) on every token of row i (geometric), truncated at C or zeroed above C
    (MIS); token and sequence levels with ``mask`` handling likewise. Float64 loops."""
    train, rollout, mask = batch(seed, spread=0.4)
    log_r = rc.log_ratio(train, rollout)
    threshold = 1.3
    for level in ("geometric", "token", "sequence"):
        expected = torch.zeros_like(log_r)
        for i in range(log_r.shape[0]):
            tokens = [t for t in range(log_r.shape[1]) if mask[i, t] == 1]
            for t in tokens:
                if level == "token":
                    exponent = float(log_r[i, t])
                else:
                    total = sum(float(log_r[i, s]) for s in tokens)
                    exponent = total if level == "sequence" else total / len(tokens)
                w = math.exp(min(max(exponent, -20.0), 20.0))
                expected[i, t] = min(w, threshold) if handling == "truncate" else (w if w <= threshold else 0.0)
        ours = rc.importance_weights(log_r, mask, level, threshold, handling=handling)
        torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)
    geometric = rc.importance_weights(log_r, mask, "geometric", threshold, handling=handling)
    assert not torch.allclose(geometric, rc.importance_weights(log_r, mask, "sequence", threshold, handling=handling))


def test_bad_settings_are_refused_in_one_line():
    train, rollout, mask = batch(0)
    log_r = rc.log_ratio(train, rollout)
    for call, setting in [
        (lambda: rc.importance_weights(log_r, mask, "tokens", 2.0), "rollout_is="),
        (lambda: rc.importance_weights(log_r, mask, "token", 0.0), "rollout_is_threshold="),
        (lambda: rc.importance_weights(log_r, mask, "token", 2.0, handling="clip"), "rollout_is_handling="),
        (lambda: rc.rejection_mask(log_r, mask, "seq_max_k1", 1.0), "rollout_rs="),
        (lambda: rc.rejection_mask(log_r, mask, "token_k2", "0.1_2"), "rollout_rs_threshold="),
        (lambda: rc.rejection_mask(log_r, mask, "token_k1,token_k2", "1,2,3"), "rollout_rs_threshold="),
        (lambda: rc.rejection_mask(log_r, mask, "seq_sum_k1", 0.9), "rollout_rs_threshold="),  # lower 1/0.9 > upper
    ]:
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value).startswith(setting) and "\n" not in str(error.value)


def replay_reference(logits_row, token, temperature, top_k, top_p, min_p):
    """One position in float64 python: vLLM's kept set (min-p, then top-k, then top-p over the top-k-renormalised
    distribution, at least the top token kept), the sampled token added; returns (log q(token), log S)."""
    scaled = [float(v) / temperature for v in logits_row]
    top = max(scaled)
    z = sum(math.exp(v - top) for v in scaled)
    p = [math.exp(v - top) / z for v in scaled]
    kept = set(range(len(p)))
    if min_p > 0:
        kept = {i for i in kept if p[i] >= min_p * max(p)}
    if top_k > 0:
        kth = sorted((scaled[i] for i in kept), reverse=True)[min(top_k, len(kept)) - 1]
        kept = {i for i in kept if scaled[i] >= kth}
    if top_p < 1:
        mass = sum(p[i] for i in kept)
        ascending = sorted(kept, key=lambda i: p[i])
        running, dropped = 0.0, set()
        for position, i in enumerate(ascending):
            running += p[i] / mass
            if running <= 1 - top_p and position < len(ascending) - 1:
                dropped.add(i)
        kept -= dropped
    kept.add(token)
    kept_mass = sum(p[i] for i in kept)
    return math.log(p[token] / kept_mass), math.log(kept_mass)


@pytest.mark.parametrize("top_k, top_p, min_p", [(5, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.05), (7, 0.9, 0.02),
                                                  (0, 1.0, 0.0)])
def test_truncated_support_logps_against_a_loop(top_k, top_p, min_p):
    generator = torch.Generator().manual_seed(11)
    logits = 3 * torch.randn(3, 5, 20, generator=generator, dtype=D)
    tokens = torch.randint(20, (3, 5), generator=generator)
    logq, log_kept = rc.truncated_support_logps(logits, tokens, 0.9, top_k, top_p, min_p)
    for i in range(3):
        for t in range(5):
            expected_logq, expected_log_kept = replay_reference(logits[i, t], int(tokens[i, t]), 0.9, top_k, top_p,
                                                                min_p)
            assert abs(float(logq[i, t]) - expected_logq) < 1e-5
            assert abs(float(log_kept[i, t]) - expected_log_kept) < 1e-5
    full = torch.log_softmax(logits.float() / 0.9, dim=-1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(full - logq.float(), log_kept.float())  # the bias is log S on every token
    if (top_k, top_p, min_p) == (0, 1.0, 0.0):
        assert log_kept.abs().max() < 1e-6  # no truncation: no bias
    else:
        assert log_kept.max() < -1e-3  # truncation: every token carries it


def kept_set_reference(h, weight, bias, token, kept, temperature, scale, softcap):
    """log q(y) on kept set K by a float64 loop: z_k = softcap tanh(scale (h . W_k + b_k) / softcap) / T."""
    def z(k):
        value = sum(float(h[j]) * float(weight[k, j]) for j in range(len(h)))
        value = scale * (value + (float(bias[k]) if bias is not None else 0.0))
        return (softcap * math.tanh(value / softcap) if softcap else value) / temperature
    return z(token) - math.log(sum(math.exp(z(k)) for k in kept))


@pytest.mark.parametrize("with_bias, scale, softcap", [(False, 1.0, None), (True, 0.5, 3.0)])
def test_kept_set_logps_against_a_loop(with_bias, scale, softcap):
    generator = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(6, 4, generator=generator, dtype=D), torch.randn(12, 4, generator=generator, dtype=D)
    bias = torch.randn(12, generator=generator, dtype=D) if with_bias else None
    tokens = torch.randint(12, (6,), generator=generator)
    kept = torch.full((6, 4), -1)
    for n in range(6):  # ragged kept sets of 1 to 4 ids, each holding its token
        others = [int(i) for i in torch.randperm(12, generator=generator) if int(i) != int(tokens[n])][: n % 4]
        kept[n, : len(others) + 1] = torch.tensor([int(tokens[n]), *others])
    weight.requires_grad_(True)
    logq = rc.kept_set_logps(hidden, weight, bias, tokens, kept, 0.9, scale, softcap)
    for n in range(6):
        ids = [int(i) for i in kept[n] if i >= 0]
        expected = kept_set_reference(hidden[n], weight.detach(), bias, int(tokens[n]), ids, 0.9, scale, softcap)
        assert abs(float(logq[n].detach()) - expected) < 1e-5
    assert float(logq.detach()[kept[:, 1] < 0].abs().max()) < 1e-6  # a kept set of one token: log q = 0
    logq.sum().backward()
    assert weight.grad.abs().sum() > 0  # the policy learns through the replayed log-probabilities


def test_kept_set_logps_on_the_sampling_parameters_kept_set_equal_the_replay():
    """Where the kept set is the one the sampling parameters make (truncated_support, float64), log q on it is
    truncated_support_logps's."""
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 5, 8, generator=generator, dtype=D)
    weight = torch.randn(30, 8, generator=generator, dtype=D)
    logits = hidden @ weight.T
    tokens = torch.distributions.Categorical(logits=logits).sample()
    support = rc.truncated_support(logits, 0.9, top_k=6, top_p=0.8)
    support.scatter_(-1, tokens[..., None], True)
    width = int(support.sum(-1).max())
    kept = torch.where(support, torch.arange(30), -1).sort(-1, descending=True).values[..., :width]
    logq = rc.kept_set_logps(hidden.reshape(-1, 8), weight, None, tokens.reshape(-1), kept.reshape(-1, width), 0.9)
    expected, log_kept = rc.truncated_support_logps(logits, tokens, 0.9, top_k=6, top_p=0.8)
    torch.testing.assert_close(logq.double(), expected.reshape(-1).double(), atol=1e-5, rtol=0)
    assert log_kept.max() < -1e-3  # the case truncates


def test_a_kept_set_without_its_token_is_refused():
    with pytest.raises(ValueError, match="does not hold the sampled token"):
        rc.kept_set_logps(torch.randn(1, 4), torch.randn(8, 4), None, torch.tensor([2]), torch.tensor([[1, 3]]), 1.0)
