"""THR / NTHR (docs/methods.md §3): scores against float64 references built from the definitions (materialised
distributions, explicit loops over token pairs), threshold and reweighting logic on hand-built groups, strategies."""

from __future__ import annotations

import math

import pytest
import torch

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.thr import (
    nthr_token_advantages,
    thr_threshold,
    thr_token_advantages,
    token_hidden_reward_scores,
    top_entropy_mask,
)
from sharpgrpo.strategy_params import StrategyParams

V, H = 50, 16


def make_group(seed, G=4, T=7, positive=None, bias=True, logit_scale=1.0, full_rows=False):
    """A random group: hidden (G, T, H), ids (G, T), mask (G, T) with random lengths (some maybe 0), W (V, H)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(G, T, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * logit_scale / math.sqrt(H)
    b = torch.randn(V, generator=gen) * 0.5 if bias else None
    ids = torch.randint(0, V, (G, T), generator=gen)
    # a few repeated ids so that [y == y'] terms occur
    ids[:, 0] = ids[0, 0]
    lengths = torch.full((G,), T) if full_rows else torch.randint(1, T + 1, (G,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    if positive is None:
        positive = torch.zeros(G, dtype=torch.bool)
        positive[torch.randperm(G, generator=gen)[: max(1, G // 2)]] = True
    return hidden, ids, mask, positive, weight, b


def reference_scores(hidden, ids, mask, positive, weight, bias, temperature, vocab="full", beta=1.0,
                     length_normalized=True):
    """Direct float64 implementation of docs/methods.md §3 with explicit loops over token pairs."""
    h = hidden.double()
    logits = h @ weight.double().T
    if bias is not None:
        logits = logits + bias.double()
    q_full = torch.softmax(logits / temperature, dim=-1)  # (G, T, V)
    entropy = -(q_full * q_full.log()).sum(-1)
    G, T = mask.shape
    tokens = [(i, k) for i in range(G) for k in range(T) if mask[i, k]]
    if vocab == "sampled":
        support = sorted({int(ids[i, k]) for i, k in tokens})
    else:
        support = list(range(weight.shape[0]))
    column = {v: n for n, v in enumerate(support)}
    q = q_full[..., support]

    def err(i, k):
        e = torch.zeros(len(support), dtype=torch.float64)
        e[column[int(ids[i, k])]] = 1.0
        return e - q[i, k]

    lengths = mask.sum(1)
    pos_tokens = [(i, k) for i, k in tokens if positive[i]]
    scores = torch.zeros(G, T, dtype=torch.float64)
    for j, m in tokens:
        total = 0.0
        for i, k in pos_tokens:
            alpha = float(err(i, k) @ err(j, m))
            weight_i = 1.0 / float(lengths[i]) if length_normalized else 1.0
            total += weight_i * alpha * float(h[i, k] @ h[j, m])
        scores[j, m] = total if positive[j] else -total
    influence = torch.full((G,), math.nan, dtype=torch.float64)
    for i2 in range(G):
        if not positive[i2] or lengths[i2] == 0:
            continue
        per_token = []
        for m in range(T):
            if not mask[i2, m]:
                continue
            per_token.append(sum(float(err(i, k) @ err(i2, m)) * float(h[i, k] @ h[i2, m]) for i, k in pos_tokens))
        influence[i2] = sum(per_token) / len(per_token)
    valid_influence = influence[~influence.isnan()]
    tau = beta * float(valid_influence.min()) if valid_influence.numel() else math.nan
    return scores, tau, influence, entropy * mask


def assert_scores_close(result, reference, mask):
    scores, tau, influence, entropy = reference
    scale = max(float(scores.abs().max()), 1e-12)
    torch.testing.assert_close(result.scores.double(), scores * mask, rtol=1e-5, atol=1e-5 * scale)
    inf_scale = max(float(influence[~influence.isnan()].abs().max()), 1e-12) if (~influence.isnan()).any() else 1.0
    torch.testing.assert_close(result.sequence_influence.double(), influence, rtol=1e-5, atol=1e-5 * inf_scale,
                               equal_nan=True)
    if math.isnan(tau):
        assert math.isnan(result.tau)
    else:
        assert result.tau == pytest.approx(tau, rel=1e-5, abs=1e-5 * inf_scale)
    if result.entropies is not None:
        torch.testing.assert_close(result.entropies.double(), entropy, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("vocab", ["full", "sampled"])
@pytest.mark.parametrize("method", ["factored", "pairwise"])
def test_scores_match_float64_reference(seed, vocab, method):
    temperature = 0.7 if seed % 2 else 1.0
    hidden, ids, mask, positive, weight, bias = make_group(seed, bias=seed != 2)
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, temperature, vocab, chunk_size=3,
                                        compute_entropy=True, method=method, beta=1.3)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, temperature, vocab, beta=1.3)
    assert_scores_close(result, reference, mask)


@pytest.mark.parametrize("vocab", ["full", "sampled"])
@pytest.mark.parametrize("method", ["factored", "pairwise"])
def test_unnormalised_scores_match_reference(vocab, method):
    hidden, ids, mask, positive, weight, bias = make_group(11)
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, 1.0, vocab, length_normalized=False,
                                        method=method)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 1.0, vocab, length_normalized=False)
    assert_scores_close(result, reference, mask)


def test_sampled_differs_from_full():
    hidden, ids, mask, positive, weight, bias = make_group(5)
    full = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, vocab="full")
    sampled = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, vocab="sampled")
    assert not torch.allclose(full.scores, sampled.scores, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("method", ["factored", "pairwise", "auto"])
def test_chunk_size_does_not_change_results(method):
    hidden, ids, mask, positive, weight, bias = make_group(7, G=5, T=6)
    results = [
        token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, 0.9, "full", chunk, method=method,
                                   compute_entropy=True)
        for chunk in (1, 2, 3, 7, 1000)
    ]
    scale = float(results[-1].scores.abs().max())
    for other in results[:-1]:
        torch.testing.assert_close(other.scores, results[-1].scores, rtol=1e-6, atol=1e-6 * scale)
        torch.testing.assert_close(other.entropies, results[-1].entropies, rtol=1e-6, atol=1e-6)
        assert other.tau == pytest.approx(results[-1].tau, rel=1e-6)


def test_rounded_vocabulary_slices_match_one_slice():
    # A vocabulary large enough for slice widths >= 1024 (rounded to multiples of 128, last slice shorter).
    gen = torch.Generator().manual_seed(21)
    vocab = 2500
    hidden, ids = torch.randn(3, 7, H, generator=gen), torch.randint(0, vocab, (3, 7), generator=gen)
    weight = torch.randn(vocab, H, generator=gen) / math.sqrt(H)
    mask, positive = torch.ones(3, 7), torch.tensor([True, False, True])
    for method in ("factored", "pairwise"):
        sliced = token_hidden_reward_scores(hidden, ids, mask, positive, weight, None, chunk_size=10, method=method)
        whole = token_hidden_reward_scores(hidden, ids, mask, positive, weight, None, chunk_size=10**6, method=method)
        torch.testing.assert_close(sliced.scores, whole.scores, rtol=1e-5, atol=1e-6 * float(whole.scores.abs().max()))
        assert sliced.tau == pytest.approx(whole.tau, rel=1e-5)


def test_methods_agree_and_auto_picks_one_of_them():
    hidden, ids, mask, positive, weight, bias = make_group(8, G=6, T=5)
    factored = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="factored")
    pairwise = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="pairwise")
    auto = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="auto")
    scale = float(factored.scores.abs().max())
    torch.testing.assert_close(factored.scores, pairwise.scores, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(auto.scores, factored.scores, rtol=1e-5, atol=1e-5 * scale)


def test_single_token_completions():
    hidden, ids, mask, positive, weight, bias = make_group(3, G=4, T=1)
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, compute_entropy=True)
    assert_scores_close(result, reference_scores(hidden, ids, mask, positive, weight, bias, 1.0), mask)


def test_all_correct_group_matches_reference():
    hidden, ids, mask, _, weight, bias = make_group(4)
    positive = torch.ones(4, dtype=torch.bool)
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias)
    assert_scores_close(result, reference_scores(hidden, ids, mask, positive, weight, bias, 1.0), mask)


def test_none_correct_group_has_zero_scores_and_no_threshold():
    hidden, ids, mask, _, weight, bias = make_group(4)
    positive = torch.zeros(4, dtype=torch.bool)
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, compute_entropy=True)
    assert torch.equal(result.scores, torch.zeros_like(result.scores))
    assert math.isnan(result.tau)
    assert result.sequence_influence.isnan().all()
    assert (result.entropies[mask.bool()] > 0).all()


def test_empty_completions_and_padding_values_are_ignored():
    hidden, ids, mask, positive, weight, bias = make_group(9, G=5, T=6)
    mask[1] = 0  # an empty completion
    positive[1] = True
    positive[2] = False
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="factored")
    assert_scores_close(result, reference_scores(hidden, ids, mask, positive, weight, bias, 1.0), mask)
    assert math.isnan(float(result.sequence_influence[1]))
    garbage_hidden, garbage_ids = hidden.clone(), ids.clone()
    garbage_hidden[~mask.bool()] = 1e3
    garbage_ids[~mask.bool()] = 0
    again = token_hidden_reward_scores(garbage_hidden, garbage_ids, mask, positive, weight, bias, method="factored")
    torch.testing.assert_close(again.scores, result.scores)


def test_row_permutation_permutes_scores():
    hidden, ids, mask, positive, weight, bias = make_group(10, G=5)
    perm = torch.tensor([3, 0, 4, 1, 2])
    base = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias)
    permuted = token_hidden_reward_scores(hidden[perm], ids[perm], mask[perm], positive[perm], weight, bias)
    scale = float(base.scores.abs().max())
    torch.testing.assert_close(permuted.scores, base.scores[perm], rtol=1e-5, atol=1e-5 * scale)
    assert permuted.tau == pytest.approx(base.tau, rel=1e-5)


@pytest.mark.parametrize("method", ["factored", "pairwise"])
def test_peaked_distributions_keep_per_token_relative_accuracy(method):
    # Large logits: q(y) close to 1 for many tokens, whose scores are tiny and need 1 - q(y) to full precision.
    hidden, ids, mask, positive, weight, bias = make_group(12, logit_scale=30.0)
    ids = (hidden @ weight.T + bias).argmax(-1)  # the sampled token is the mode
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method=method)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 1.0)[0]
    valid = mask.bool()
    assert float(reference[valid].abs().min()) < 1e-12 * float(reference[valid].abs().max())
    torch.testing.assert_close(result.scores.double()[valid], reference[valid], rtol=1e-3, atol=0.0)


def test_confident_token_keeps_relative_accuracy():
    # q(y) = 1 - O(1e-5): the score of such a token is O((1 - q(y))^2) and needs 1 - q(y) to full fp32 precision.
    hidden, ids, mask, _, weight, bias = make_group(14, G=2, T=1)
    positive = torch.tensor([True, False])
    bias = torch.zeros(V)
    bias[ids[0, 0]] = 14.0
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 1.0)[0]
    assert float(reference[0, 0]) < 1e-6
    assert float(result.scores[0, 0]) == pytest.approx(float(reference[0, 0]), rel=1e-4)


def test_bfloat16_products_are_close():
    hidden, ids, mask, positive, weight, bias = make_group(13)
    exact = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias)
    for method in ("factored", "pairwise"):
        approx = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method=method,
                                            matmul_dtype=torch.bfloat16)
        scale = float(exact.scores.abs().max())
        torch.testing.assert_close(approx.scores, exact.scores, rtol=0.0, atol=0.05 * scale)


def test_invalid_options_raise():
    hidden, ids, mask, positive, weight, bias = make_group(0)
    with pytest.raises(ValueError, match="vocab"):
        token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, vocab="top")
    with pytest.raises(ValueError, match="method"):
        token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="magic")
    with pytest.raises(ValueError, match="chunk_size"):
        token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, chunk_size=0)


# ---------------------------------------------------------------- reweighting (Eq. 5), hand-built scores

def hand_group():
    scores = torch.tensor([[3.0, -3.0, 1.0, 2.0], [-5.0, 0.5, 2.0, 9.0], [2.5, -2.5, -1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    positive = torch.tensor([True, False, False])
    advantages = torch.tensor([1.0, -0.5, -0.5])
    return scores, mask, positive, advantages


def test_thr_eq5_on_hand_built_group():
    scores, mask, positive, advantages = hand_group()
    new, metrics = thr_token_advantages(scores, 2.0, advantages, mask, positive, p=0.1)
    expected = torch.tensor([
        [1.1, 0.9, 0.0, 0.0],  # |2.0| is not > tau = 2
        [-0.5 * 0.9, 0.0, 0.0, -0.5],  # masked position keeps its advantage
        [-0.5 * 1.1, -0.5 * 0.9, 0.0, -0.5 * 1.1],
    ])
    torch.testing.assert_close(new, expected)
    # valid tokens: 11; above: 3, -3, -5, 2.5, -2.5, 7 -> 6; positive among them: 3, 2.5, 7
    assert metrics["thr/frac_retained"] == pytest.approx(6 / 11)
    assert metrics["thr/frac_positive"] == pytest.approx(3 / 6)
    assert metrics["thr/tau"] == 2.0 and metrics["thr/frac_groups_tau_negative"] == 0.0
    _, negative = thr_token_advantages(scores, -0.5, advantages, mask, positive, p=0.1)
    assert negative["thr/frac_groups_tau_negative"] == 1.0 and negative["thr/frac_retained"] == 1.0
    valid = mask.bool()
    assert metrics["thr/abs_mean"] == pytest.approx(float(scores.abs()[valid].mean()))


def test_thr_negative_p_and_keep_below_threshold():
    scores, mask, positive, advantages = hand_group()
    new, _ = thr_token_advantages(scores, 2.0, advantages, mask, positive, p=-0.2, keep_below_threshold=True)
    expected = torch.tensor([
        [0.8, 1.2, 1.0, 1.0],
        [-0.5 * 1.2, -0.5, -0.5, -0.5],
        [-0.5 * 0.8, -0.5 * 1.2, -0.5, -0.5 * 0.8],
    ])
    torch.testing.assert_close(new, expected)


def test_thr_token_level_input_advantages():
    scores, mask, positive, advantages = hand_group()
    token_adv = advantages[:, None].repeat(1, 4) * torch.tensor([1.0, 2.0, 3.0, 4.0])
    new, _ = thr_token_advantages(scores, 2.0, token_adv, mask, positive, p=0.1)
    broadcast, _ = thr_token_advantages(scores, 2.0, advantages, mask, positive, p=0.1)
    expected = torch.where(mask.bool(), broadcast * torch.tensor([1.0, 2.0, 3.0, 4.0]), token_adv)
    torch.testing.assert_close(new, expected)


def test_thr_entropy_quantile_readds_high_entropy_tokens():
    scores, mask, positive, advantages = hand_group()
    entropies = torch.tensor([[0.1, 0.2, 5.0, 0.3], [0.1, 4.0, 0.2, 9.0], [6.0, 0.1, 0.2, 0.3]])
    # 11 valid tokens, q = 0.3 -> k = ceil(3.3) = 4 highest valid entropies: 6.0, 5.0, 4.0, 0.3 (two tokens at 0.3)
    top = top_entropy_mask(entropies, mask, 0.3)
    expected_top = torch.tensor([[0, 0, 1, 1], [0, 1, 0, 0], [1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(top, expected_top)
    new, metrics = thr_token_advantages(scores, 2.0, advantages, mask, positive, p=0.1, entropies=entropies,
                                        entropy_quantile=0.3)
    expected = torch.tensor([
        [1.1, 0.9, 1.0, 1.0],  # (0,2) and (0,3) re-added unchanged
        [-0.5 * 0.9, -0.5, 0.0, -0.5],  # (1,1) re-added; (1,3) is padding
        [-0.5 * 1.1, -0.5 * 0.9, 0.0, -0.5 * 1.1],  # (2,0) already above threshold keeps 1 + p
    ])
    torch.testing.assert_close(new, expected)
    assert metrics["thr/frac_entropy_added"] == pytest.approx(3 / 11)
    with pytest.raises(ValueError, match="entropies"):
        thr_token_advantages(scores, 2.0, advantages, mask, positive, entropy_quantile=0.2)


@pytest.mark.parametrize("positive", [torch.tensor([True, True, True]), torch.tensor([False, False, False])])
def test_unmixed_groups_are_unchanged(positive):
    scores, mask, _, advantages = hand_group()
    new, metrics = thr_token_advantages(scores, 2.0, advantages, mask, positive)
    assert torch.equal(new, advantages[:, None].expand(3, 4))
    assert metrics == {}
    new, metrics = nthr_token_advantages(scores, 2.0, advantages, mask, positive)
    assert torch.equal(new, advantages[:, None].expand(3, 4))
    assert metrics == {}


def test_nthr_rescales_only_incorrect_tokens_above_threshold():
    scores, mask, positive, advantages = hand_group()
    new, metrics = nthr_token_advantages(scores, 2.0, advantages, mask, positive)
    eta = 2 * abs(0.5 - 1 / 3)
    # incorrect rows 1, 2: NTHR = -scores; > 2 at (1,0) = 5 and (2,1) = 2.5 ((1,3) is padding)
    expected = advantages[:, None].repeat(1, 4)
    expected[1, 0] *= eta
    expected[2, 1] *= eta
    torch.testing.assert_close(new, expected)
    assert metrics["nthr/eta"] == pytest.approx(eta)
    assert metrics["nthr/frac_selected"] == pytest.approx(2 / 7)
    assert metrics["nthr/tau"] == 2.0


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_thr_threshold_matches_float64_reference(seed):
    # docs/methods.md §3: tau = beta * min_{i' in P} (1/|y_i'|) sum_m THR[i', m], self-pairs included, computed here
    # by explicit loops from the float64 reference scores.
    hidden, ids, mask, _, weight, bias = make_group(seed, G=5)  # random lengths: the 1/|y_i'| matters
    positive = torch.tensor([True, False, True, True, False])
    scores = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, temperature=0.7).scores
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 0.7)[0]
    means = []
    for i in range(5):
        if positive[i]:
            tokens = [float(reference[i, m]) for m in range(mask.shape[1]) if mask[i, m]]
            means.append(sum(tokens) / len(tokens))
    expected = 0.7 * min(means)
    assert thr_threshold(scores, mask, positive, beta=0.7) == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert math.isnan(thr_threshold(scores, mask, torch.zeros(5, dtype=torch.bool)))


# ---------------------------------------------------------------- registered strategies

def make_batch(seed=0, G=4, T=6, vocab_bias=True):
    gen = torch.Generator().manual_seed(seed)
    groups = 3
    B = groups * G
    hidden = torch.randn(B, T, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) / math.sqrt(H)
    bias = torch.randn(V, generator=gen) * 0.5 if vocab_bias else None
    ids = torch.randint(0, V, (B, T), generator=gen)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0] + [1.0] * 4 + [0.0, 1.0, 0.0, 0.0])
    grouped = rewards.view(groups, G)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(B)
    advantages = adv[:, None].repeat(1, T)
    return GenerationBatch(
        old_logps=torch.zeros(B, T), completion_mask=mask, completion_ids=ids, advantages=advantages,
        rewards=rewards, group_ids=torch.arange(groups).repeat_interleave(G), num_generations=G,
        hidden_states=hidden, unembedding_weight=weight, unembedding_bias=bias, temperature=0.8,
    )


def test_thr_strategy_matches_per_group_functions():
    batch = make_batch()
    args = StrategyParams(thr_p=0.1, thr_beta=0.5, thr_keep_below_threshold=False, thr_entropy_quantile=0.25,
                           thr_vocab="sampled", thr_chunk_size=5)
    strategy = STRATEGIES.get("thr")(args)
    assert strategy.needs_hidden_states and strategy.kind == "advantage"
    out, metrics = strategy.token_advantages(batch)
    expected = batch.advantages.clone()
    for rows in (slice(0, 4), slice(8, 12)):  # the mixed groups
        positive = batch.rewards[rows] == 1
        result = token_hidden_reward_scores(
            batch.hidden_states[rows], batch.completion_ids[rows], batch.completion_mask[rows], positive,
            batch.unembedding_weight, batch.unembedding_bias, 0.8, "sampled", 5, beta=0.5, compute_entropy=True)
        tau = thr_threshold(result.scores, batch.completion_mask[rows], positive, beta=0.5)
        expected[rows], _ = thr_token_advantages(result.scores, tau, batch.advantages[rows],
                                                 batch.completion_mask[rows], positive, 0.1, False,
                                                 result.entropies, 0.25)
        torch.testing.assert_close(strategy.last_scores[rows], result.scores)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[4:8], batch.advantages[4:8])  # all-correct group untouched
    assert torch.equal(strategy.last_scores[4:8], torch.zeros(4, 6))
    assert math.isnan(strategy.last_tau[1]) and not math.isnan(strategy.last_tau[0])
    assert metrics["thr/frac_mixed_groups"] == pytest.approx(2 / 3)
    for key in ("thr/frac_retained", "thr/frac_positive", "thr/tau", "thr/abs_mean", "thr/frac_entropy_added",
                "thr/frac_groups_tau_negative"):
        assert key in metrics and math.isfinite(metrics[key])
    assert metrics["thr/tau"] == pytest.approx((strategy.last_tau[0] + strategy.last_tau[2]) / 2)


def test_thr_strategy_positive_set_comes_from_batch_correct():
    # batch.correct (the answer checks) defines P, not the rewards: flipping it changes the scores' signs.
    batch = make_batch(seed=3)
    strategy = STRATEGIES.get("thr")(StrategyParams())
    strategy.token_advantages(batch)
    from_rewards = strategy.last_scores.clone()
    correct = torch.zeros(12, dtype=torch.bool)
    correct[[1, 2, 9]] = True  # the complement of the rewards' P in both mixed groups
    strategy.token_advantages(GenerationBatch(**{**batch.__dict__, "correct": correct}))
    rows = slice(0, 4)
    result = token_hidden_reward_scores(batch.hidden_states[rows], batch.completion_ids[rows],
                                        batch.completion_mask[rows], correct[rows], batch.unembedding_weight,
                                        batch.unembedding_bias, 0.8)
    torch.testing.assert_close(strategy.last_scores[rows], result.scores)
    assert not torch.allclose(strategy.last_scores[rows], from_rewards[rows])


def test_thr_strategy_defaults_zero_below_threshold_tokens():
    batch = make_batch(seed=1)
    out, metrics = STRATEGIES.get("thr")(StrategyParams()).token_advantages(batch)
    mixed = torch.zeros(12, dtype=torch.bool)
    mixed[0:4] = mixed[8:12] = True
    valid = batch.completion_mask.bool() & mixed[:, None]
    ratio = out[valid] / batch.advantages[valid]
    zero = ratio == 0
    assert torch.all(zero | torch.isclose(ratio, torch.tensor(1.1)) | torch.isclose(ratio, torch.tensor(0.9)))
    assert 1 - zero.float().mean() == pytest.approx(metrics["thr/frac_retained"], abs=0.25)


def test_nthr_strategy():
    batch = make_batch(seed=2)
    strategy = STRATEGIES.get("nthr")(StrategyParams(thr_beta=1.0, thr_vocab="full", thr_chunk_size=1024))
    out, metrics = strategy.token_advantages(batch)
    for rows in (slice(0, 4), slice(8, 12)):
        positive = batch.rewards[rows] == 1
        result = token_hidden_reward_scores(
            batch.hidden_states[rows], batch.completion_ids[rows], batch.completion_mask[rows], positive,
            batch.unembedding_weight, batch.unembedding_bias, 0.8, length_normalized=False)
        expected, _ = nthr_token_advantages(result.scores, result.tau, batch.advantages[rows],
                                            batch.completion_mask[rows], positive)
        torch.testing.assert_close(out[rows], expected)
    assert torch.equal(out[4:8], batch.advantages[4:8])
    assert set(metrics) == {"nthr/frac_selected", "nthr/eta", "nthr/tau", "nthr/frac_mixed_groups"}


def test_strategies_need_hidden_states_and_valid_options():
    batch = make_batch()
    no_hidden = GenerationBatch(**{**batch.__dict__, "hidden_states": None})
    with pytest.raises(ValueError, match="hidden_states"):
        STRATEGIES.get("thr")(StrategyParams()).token_advantages(no_hidden)
    with pytest.raises(ValueError, match="thr_vocab"):
        STRATEGIES.get("thr")(StrategyParams(thr_vocab="top_k"))
    with pytest.raises(ValueError, match="thr_entropy_quantile"):
        STRATEGIES.get("thr")(StrategyParams(thr_entropy_quantile=1.5))
