"""OTB and TIR-OTB (``sharpgrpo.strategies.optimal_baseline``, docs/methods.md §14) against float64 loop references
written line by line from the released code, verl-project/verl@1dda039 ``verl/trainer/ppo/core_algos.py``
``compute_optimal_token_baseline_advantage`` (L871-987) and ``compute_multi_turn_optimal_token_baseline_advantage``
(L990-1121), and ``verl/trainer/ppo/metric_utils.py`` ``compute_variance_proxy_metrics`` (L691-802, on-policy
branch). The references reproduce the released lines (reproduced here, not vendored: verl imports ray and its
trainer stack); the statistic sum_v p^2 is checked against TRL 1.16's own fused-head kernel
(``trl.kernels.chunked_logprob.ChunkedLogProbFunction``, output ``log_sum_sq_probs``), run unchanged. Where verl's
released package is installed (docs/development.md: the ``verl-reference`` install), its released functions are also
imported and run unchanged on the same batches."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies.base import GenerationBatch
from sharpgrpo.strategies.optimal_baseline import (
    OptimalTokenBaselineStrategy,
    TirOptimalTokenBaselineStrategy,
    optimal_token_baseline_advantages,
    path_variance_proxy,
    path_variance_proxy_from_others,
    sum_p_squared,
    variance_proxy_metrics,
)


def random_batch(seed: int, groups: int = 3, size: int = 4, length: int = 9, holes: bool = False,
                 empty_row: bool = False, shuffle: bool = False):
    g = torch.Generator().manual_seed(seed)
    rows = groups * size
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    if holes:  # tool results masked out inside a completion
        mask = mask * (torch.rand(rows, length, generator=g) > 0.25).double()
        mask[:, 0] = 1.0
    if empty_row:
        mask[1] = 0.0
    group_ids = torch.arange(groups).repeat_interleave(size)
    if shuffle:
        group_ids = group_ids[torch.randperm(rows, generator=g)]
    rewards = torch.randn(rows, generator=g, dtype=torch.float64)
    old_logps = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 4
    p = torch.exp(old_logps)
    sum_sq = p**2 + torch.rand(rows, length, generator=g, dtype=torch.float64) * (1 - p) ** 2  # in [p^2, 1]
    return rewards, mask, group_ids, old_logps, sum_sq


def reference_otb(rewards, mask, group_ids, old_logps, sum_sq, handle_zero_tail=True, epsilon=1e-8):
    """core_algos.py L918-985, as loops in float64 (token_level_rewards: R on the last masked-in token)."""
    B, T = mask.shape
    rewards_t = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        ones = [t for t in range(T) if mask[i, t] > 0]
        if ones:
            rewards_t[i, ones[-1]] = rewards[i]
    returns = torch.zeros(B, T, dtype=torch.float64)  # reward-to-go (L920)
    for i in range(B):
        acc = 0.0
        for t in reversed(range(T)):
            acc += float(rewards_t[i, t] * mask[i, t])
            returns[i, t] = acc
    w = [[1 - 2 * math.exp(float(old_logps[i, t])) + float(sum_sq[i, t]) for t in range(T)] for i in range(B)]
    wc = torch.zeros(B, T, dtype=torch.float64)  # L935
    for i in range(B):
        acc = 0.0
        for t in range(T):
            acc += w[i][t] * float(mask[i, t])
            wc[i, t] = acc
    groups = defaultdict(list)
    for i in range(B):
        groups[int(group_ids[i])].append(i)
    baselines = torch.zeros(B, T, dtype=torch.float64)
    for members in groups.values():
        if len(members) == 1:
            continue
        for t in range(T):
            num = sum(float(returns[i, t] * wc[i, t] * mask[i, t]) for i in members)
            den = sum(float(wc[i, t] * mask[i, t]) for i in members) + epsilon
            for i in members:
                baselines[i, t] = num / den
        if handle_zero_tail:  # L970-979
            lengths = [int(mask[i].sum()) for i in members]
            ordered = sorted(lengths)
            longest, second = ordered[-1], ordered[-2]
            at_longest = [i for i, n in zip(members, lengths) if n == longest]
            if len(at_longest) == 1 and longest > second:
                baselines[at_longest[0], second:] = 0.0
    return (returns - baselines) * mask


def reference_tir_otb(rewards, mask, group_ids, old_logps, sum_sq, handle_zero_tail=True, epsilon=1e-8):
    """core_algos.py L1033-1119, as loops in float64."""
    B, T = mask.shape
    w = [[1 - 2 * math.exp(float(old_logps[i, t])) + float(sum_sq[i, t]) for t in range(T)] for i in range(B)]
    wc = [[sum(w[i][s] * float(mask[i, s]) for s in range(t + 1)) for t in range(T)] for i in range(B)]
    lengths = [int(mask[i].sum()) for i in range(B)]
    width = max(lengths)
    all_w = [[0.0] * width for _ in range(B)]
    all_r = [[0.0] * width for _ in range(B)]
    for i in range(B):  # L1057-1063: the masked-in values, in order
        positions = [t for t in range(T) if mask[i, t] > 0]
        for k, t in enumerate(positions):
            all_w[i][k] = wc[i][t]
            all_r[i][k] = float(rewards[i])  # reward-to-go of an outcome reward on a masked-in position
    groups = defaultdict(list)
    for i in range(B):
        if lengths[i]:
            groups[int(group_ids[i])].append(i)
    baselines = [[0.0] * width for _ in range(B)]
    for members in groups.values():
        if len(members) == 1:
            continue
        for k in range(width):
            num = sum(all_r[i][k] * all_w[i][k] for i in members)
            den = sum(all_w[i][k] for i in members) + epsilon
            for i in members:
                baselines[i][k] = num / den
        if handle_zero_tail:
            group_lengths = [lengths[i] for i in members]
            ordered = sorted(group_lengths)
            longest, second = ordered[-1], ordered[-2]
            at_longest = [i for i in members if lengths[i] == longest]
            if len(at_longest) == 1 and longest > second:
                for k in range(second, width):
                    baselines[at_longest[0]][k] = 0.0
    out = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        positions = [t for t in range(T) if mask[i, t] > 0]
        for k, t in enumerate(positions):
            out[i, t] = all_r[i][k] - baselines[i][k]
    return out * mask


CASES = [
    dict(),
    dict(holes=True),
    dict(empty_row=True),
    dict(holes=True, shuffle=True),
    dict(groups=2, size=2),
    dict(groups=4, size=1),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("zero_tail", [True, False])
def test_otb_matches_the_released_lines(seed, case, zero_tail):
    rewards, mask, group_ids, old_logps, sum_sq = random_batch(seed, **case)
    w = path_variance_proxy(old_logps, sum_sq)
    got = optimal_token_baseline_advantages(rewards, mask, group_ids, w, handle_zero_tail=zero_tail)
    expected = reference_otb(rewards, mask, group_ids, old_logps, sum_sq, handle_zero_tail=zero_tail)
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("zero_tail", [True, False])
def test_tir_otb_matches_the_released_lines(seed, case, zero_tail):
    rewards, mask, group_ids, old_logps, sum_sq = random_batch(seed, **case)
    w = path_variance_proxy(old_logps, sum_sq)
    got = optimal_token_baseline_advantages(rewards, mask, group_ids, w, align="token", handle_zero_tail=zero_tail)
    expected = reference_tir_otb(rewards, mask, group_ids, old_logps, sum_sq, handle_zero_tail=zero_tail)
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)


def verl_or_skip(module: str):
    return pytest.importorskip(module, reason="verl's released code (docs/development.md, verl-reference) is not "
                                              "installed")


def outcome_token_rewards(rewards, mask):
    """verl's token_level_rewards: the outcome reward on the last masked-in token."""
    out = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        ones = mask[i].nonzero()
        if len(ones):
            out[i, ones[-1]] = rewards[i]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("zero_tail", [True, False])
def test_both_match_verls_released_functions(seed, case, zero_tail):
    core_algos = verl_or_skip("verl.trainer.ppo.core_algos")
    rewards, mask, group_ids, old_logps, sum_sq = random_batch(seed, **case)
    w = path_variance_proxy(old_logps, sum_sq)
    token_rewards = outcome_token_rewards(rewards, mask)
    for released, align in ((core_algos.compute_optimal_token_baseline_advantage, "position"),
                            (core_algos.compute_multi_turn_optimal_token_baseline_advantage, "token")):
        expected, _ = released(token_rewards, mask, group_ids.numpy(), old_logps, sum_sq, handle_zero_tail=zero_tail)
        got = optimal_token_baseline_advantages(rewards, mask, group_ids, w, align=align, handle_zero_tail=zero_tail)
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)


def test_variance_proxies_match_verls_released_metrics():
    metric_utils = verl_or_skip("verl.trainer.ppo.metric_utils")
    rewards, mask, group_ids, old_logps, sum_sq = random_batch(4, holes=True)
    w = path_variance_proxy(old_logps, sum_sq)
    adv = optimal_token_baseline_advantages(rewards, mask, group_ids, w)
    batch = SimpleNamespace(batch={"sum_pi_squared": sum_sq, "old_log_probs": old_logps, "advantages": adv,
                                   "response_mask": mask})
    expected = metric_utils.compute_variance_proxy_metrics(batch)
    got = variance_proxy_metrics(adv, mask, w)
    for name, value in got.items():
        assert value == pytest.approx(expected[f"variance_proxy/{name}"], abs=1e-9)


def test_controls_differ():
    """The two alignments differ once completions have masked-out holes, and agree without; the zero tail changes
    the longest completion's tail; the path weights matter (a constant w gives another baseline)."""
    rewards, mask, group_ids, old_logps, sum_sq = random_batch(5, holes=True)
    w = path_variance_proxy(old_logps, sum_sq)
    otb = optimal_token_baseline_advantages(rewards, mask, group_ids, w)
    tir = optimal_token_baseline_advantages(rewards, mask, group_ids, w, align="token")
    assert (otb - tir).abs().max() > 1e-3
    rewards, mask, group_ids, old_logps, sum_sq = random_batch(5)
    w = path_variance_proxy(old_logps, sum_sq)
    otb = optimal_token_baseline_advantages(rewards, mask, group_ids, w)
    tir = optimal_token_baseline_advantages(rewards, mask, group_ids, w, align="token")
    torch.testing.assert_close(otb, tir, atol=1e-12, rtol=0)
    other = optimal_token_baseline_advantages(rewards, mask, group_ids, torch.full_like(w, 0.5))
    assert (otb - other).abs().max() > 1e-3
    no_tail = optimal_token_baseline_advantages(rewards, mask, group_ids, w, handle_zero_tail=False)
    assert (otb - no_tail).abs().max() > 1e-3


def test_path_proxy_without_cancellation():
    """(1 - p)^2 + sum_{v != y} p^2 equals verl's 1 - 2p + sum p^2 in float64, and keeps its digits in float32 where
    p(y) is near 1 (verl's form there is rounding noise)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 50, generator=g, dtype=torch.float64)
    logits[:, :3, 7] += 12  # near-certain tokens: w ~ 1e-8
    ids = torch.randint(0, 50, (4, 6), generator=g)
    ids[:, :3] = 7
    p = torch.softmax(logits, dim=-1)
    p_y = p.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    sum_sq = (p**2).sum(-1)
    others = (p**2).masked_fill(torch.nn.functional.one_hot(ids, 50).bool(), 0.0).sum(-1)
    exact = ((torch.nn.functional.one_hot(ids, 50) - p) ** 2).sum(-1)
    torch.testing.assert_close(path_variance_proxy_from_others(p_y.log(), others), exact, atol=1e-15, rtol=1e-12)
    torch.testing.assert_close(path_variance_proxy(p_y.log(), sum_sq), exact, atol=1e-12, rtol=0)
    stable = path_variance_proxy_from_others(p_y.log().float(), others.float())
    verl_form = path_variance_proxy(p_y.log().float(), sum_sq.float())
    near = exact[:, :3]
    assert bool(((stable[:, :3].double() - near).abs() < 1e-3 * near).all())
    assert bool(((verl_form[:, :3].double() - near).abs() > 0.1 * near).any())


def test_variance_proxy_metrics_match_the_released_lines():
    rewards, mask, group_ids, old_logps, sum_sq = random_batch(3, holes=True)
    w = path_variance_proxy(old_logps, sum_sq)
    adv = optimal_token_baseline_advantages(rewards, mask, group_ids, w)
    got = variance_proxy_metrics(adv, mask, w)
    a, ws = [], []
    for i in range(mask.shape[0]):  # metric_utils.py L742-790, masked_mean with + 1e-8
        m = [float(x) for x in mask[i]]
        a.append(sum(float(adv[i, t]) * m[t] for t in range(len(m))) / (sum(m) + 1e-8))
        ws.append(sum((1 - 2 * math.exp(float(old_logps[i, t])) + float(sum_sq[i, t])) * m[t] for t in range(len(m))))
    n = len(a)
    assert got["proxy2_total_power"] == pytest.approx(sum(x * x * max(y, 0.0) for x, y in zip(a, ws)) / n, abs=1e-9)
    assert got["expected_a_squared"] == pytest.approx(sum(x * x for x in a) / n, abs=1e-9)
    assert got["expected_w"] == pytest.approx(sum(ws) / n, abs=1e-9)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sum_p_squared_matches_softmax_and_trls_fused_head(temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 16, generator=g)
    weight = torch.randn(301, 16, generator=g)
    bias = torch.randn(301, generator=g)
    got = sum_p_squared(hidden, weight, bias, temperature, rows_per_chunk=2, vocab_chunk=64)
    probs = torch.softmax((hidden.double() @ weight.double().T + bias.double()) / temperature, dim=-1)
    torch.testing.assert_close(got.double(), (probs**2).sum(-1), atol=1e-6, rtol=1e-5)
    ids = torch.randint(0, 301, (3, 5), generator=g)
    ids = torch.where(torch.rand(3, 5, generator=g) < 0.5, probs.argmax(-1), ids)
    others = sum_p_squared(hidden, weight, bias, temperature, rows_per_chunk=2, vocab_chunk=64, exclude_ids=ids)
    p_y = probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(others.double(), (probs**2).sum(-1) - p_y**2, atol=1e-6, rtol=1e-5)
    assert (got - others).abs().max() > 1e-2  # the most likely token's p^2 left out
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    flat = hidden.reshape(-1, 16)
    targets = torch.zeros(flat.shape[0], dtype=torch.long)
    _, _, log_sum_sq, _, _ = ChunkedLogProbFunction.apply(flat, weight, bias, targets, temperature, 64, None, 1.0,
                                                          ("log_sum_sq_probs",))
    torch.testing.assert_close(got.reshape(-1), log_sum_sq.exp(), atol=1e-6, rtol=1e-5)


@pytest.fixture
def projection_sizes(monkeypatch):
    """The element count of every ``F.linear`` output from the moment the fixture is asked for: the logit tiles."""
    tiles = []
    linear = torch.nn.functional.linear

    def spy(x, w, b=None):
        out = linear(x, w, b)
        tiles.append(out.numel())
        return out

    def start() -> list[int]:
        monkeypatch.setattr(torch.nn.functional, "linear", spy)
        return tiles

    return start


def test_sum_p_squared_never_builds_a_batch_by_vocabulary_tensor(projection_sizes):
    """Every logit tile is at most rows_per_chunk x L x vocab_chunk: counted on the projections themselves."""
    B, L, H, V = 6, 32, 8, 5000
    hidden, weight = torch.randn(B, L, H), torch.randn(V, H)
    tiles = projection_sizes()
    sum_p_squared(hidden, weight, None, 1.0, rows_per_chunk=2, vocab_chunk=512)
    assert len(tiles) == (B // 2) * math.ceil(V / 512)
    assert max(tiles) == 2 * L * 512 < B * L * V // 20


def strategy_batch(seed: int, holes: bool = False):
    """A batch whose old log-probabilities are those of the hidden states through the head (the sampling policy)."""
    rewards, mask, group_ids, _, _ = random_batch(seed, holes=holes)
    g = torch.Generator().manual_seed(seed + 100)
    B, T = mask.shape
    hidden = torch.randn(B, T, 8, generator=g)
    weight = torch.randn(50, 8, generator=g)
    probs = torch.softmax(hidden.double() @ weight.double().T / 0.9, dim=-1)
    ids = torch.multinomial(probs.reshape(-1, 50), 1, generator=g).reshape(B, T)
    old_logps = probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1).log()
    advantages = (rewards - rewards.mean())[:, None].expand(B, T).float()
    batch = GenerationBatch(old_logps.float(), mask.float(), ids, advantages, rewards.float(), group_ids, 4,
                            hidden_states=hidden, unembedding_weight=weight, temperature=0.9)
    return batch, old_logps, (probs**2).sum(-1)


@pytest.mark.parametrize("cls,align", [(OptimalTokenBaselineStrategy, "position"),
                                       (TirOptimalTokenBaselineStrategy, "token")])
def test_strategy_reads_the_head_statistic(cls, align):
    batch, old_logps, sum_sq = strategy_batch(7, holes=True)
    strategy = cls(SimpleNamespace(otb_handle_zero_tail=True, otb_vocab_chunk=16))  # several vocabulary tiles
    out, metrics = strategy.token_advantages(batch)
    expected = (reference_otb if align == "position" else reference_tir_otb)(
        batch.rewards.double(), batch.completion_mask.double(), batch.group_ids, old_logps, sum_sq)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    prefix = cls.metric_prefix
    assert set(metrics) == {f"{prefix}/proxy2_total_power", f"{prefix}/proxy2_total_power_input",
                            f"{prefix}/expected_a_squared", f"{prefix}/expected_w", f"{prefix}/baseline_mean"}
    assert all(math.isfinite(v) for v in metrics.values())


def test_sum_p_squared_tiles_stay_bounded_at_long_context(projection_sizes):
    """At long L the vocabulary tile narrows so that a tile holds at most chunk_size * V logits (the sampling
    log-probabilities' rule, thr_vocab.slice_width), whatever vocab_chunk says; the result is unchanged."""
    B, L, H, V = 2, 600, 8, 700
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(B, L, H, generator=g), torch.randn(V, H, generator=g)
    ids = torch.randint(0, V, (B, L), generator=g)
    wide = sum_p_squared(hidden, weight, None, 1.0, rows_per_chunk=2, vocab_chunk=V, exclude_ids=ids)
    tiles = projection_sizes()
    narrow = sum_p_squared(hidden, weight, None, 1.0, rows_per_chunk=2, vocab_chunk=V, exclude_ids=ids,
                           chunk_size=100)
    assert max(tiles) <= 100 * V < B * L * V and len(tiles) > 1
    torch.testing.assert_close(narrow, wide, atol=1e-6, rtol=1e-5)
    probs = torch.softmax(hidden.double() @ weight.double().T, dim=-1)
    p_y = probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(narrow.double(), (probs**2).sum(-1) - p_y**2, atol=1e-6, rtol=1e-5)
