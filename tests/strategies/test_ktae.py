"""KTAE (docs/methods.md §11.4): the key-token scores against a float64 loop reference with an exact (rational)
Fisher test, and against the authors' released computation on fixed inputs.

Released code read: xiaolizh1/KTAE at commit ea9fb77f366216d754e2368653911724e73a7376,
``verl/workers/actor/compute_key_tokens.py`` (``fisher_exact_test`` l. 26-51, ``calculate_ig`` l. 54-77,
``compute_tf`` l. 80-98, ``compute_key_tokens`` l. 132-173: the 2 x 2 table per token id, exp(-2p) with p = 1 mapped to
0, Cohen's h plus the BM25 ratio, ((alpha F + beta IG) x) / (alpha + beta), (sigmoid - 0.5) * 2 * top, token 151643
zeroed) and ``verl/trainer/ppo/core_algos.py`` l. 155-234 (``compute_ktae_outcome_advantage_and_keytokens``: correct
means reward > 0, the GRPO advantage (score - mean) / (std + 1e-6) plus the key score of each token, both times the
mask; alpha = beta_ig = gamma_tf = top = 1.0 passed as literals, l. 214-218). ``released_ktae`` below re-derives that
computation in float32 from this reading.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.ktae import fisher_exact_pvalues, information_gain, key_token_scores
from sharpgrpo.strategy_params import StrategyParams
from sharpgrpo.validation import ConfigError


def exact_fisher(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p-value by enumerating every table with the observed margins (exact rationals)."""
    row, col, n = a + b, a + c, a + b + c + d

    def prob(k):
        return Fraction(math.comb(col, k) * math.comb(n - col, row - k), math.comb(n, row))

    observed = prob(a)
    return float(sum(prob(k) for k in range(max(0, row + col - n), min(row, col) + 1) if prob(k) <= observed))


def loop_key_scores(ids, mask, correct, alpha, beta, frequency, scale):
    """The module docstring's formulas, one token id at a time, in float64."""
    rows, length = len(ids), len(ids[0])
    n_c, n_w = sum(correct), len(correct) - sum(correct)
    out = [[0.0] * length for _ in range(rows)]
    if n_c == 0 or n_w == 0:
        return out
    vocab = {ids[i][t] for i in range(rows) for t in range(length) if mask[i][t]}
    tokens_c = [ids[i][t] for i in range(rows) for t in range(length) if mask[i][t] and correct[i]]
    tokens_w = [ids[i][t] for i in range(rows) for t in range(length) if mask[i][t] and not correct[i]]
    mean_len = (len(tokens_c) + len(tokens_w)) / 2
    score = {}
    for v in vocab:
        a = sum(1 for i in range(rows) if correct[i] and any(mask[i][t] and ids[i][t] == v for t in range(length)))
        b = sum(1 for i in range(rows) if not correct[i] and any(mask[i][t] and ids[i][t] == v for t in range(length)))
        c, d = n_c - a, n_w - b
        p = exact_fisher(a, b, c, d)
        fisher = 0.0 if p >= 1 - 1e-12 else math.exp(-2 * p)
        n = a + b + c + d

        def h2(x, y):
            tot = x + y
            return 0.0 if tot == 0 else -sum(q * math.log2(q) for q in (x / tot, y / tot) if q > 0)

        ig = h2(a + c, b + d) - ((a + b) / n * h2(a, b) + (c + d) / n * h2(c, d))
        x = math.asin(math.sqrt(a / n_c)) - math.asin(math.sqrt(b / n_w))
        if frequency:
            tf = []
            for tokens in (tokens_c, tokens_w):
                f = tokens.count(v) / len(tokens)
                tf.append(f * 3.0 / (f + 2.0 * (0.5 + 0.5 * len(tokens) / mean_len)))
            x += tf[0] / (tf[1] + 1e-5) - tf[1] / (tf[0] + 1e-5)
        s = (alpha * fisher + beta * ig) * x / (alpha + beta)
        sigmoid = 1 / (1 + math.exp(-s)) if s > -700 else 0.0
        score[v] = (sigmoid - 0.5) * 2 * scale
    for i in range(rows):
        for t in range(length):
            if mask[i][t]:
                out[i][t] = score[ids[i][t]]
    return out


def test_fisher_pvalues_match_exact_enumeration():
    tables = [(a, b, c, d) for a in range(5) for b in range(5) for c in range(4) for d in range(4) if a + b + c + d]
    got = fisher_exact_pvalues(torch.tensor(tables, dtype=torch.float64))
    expected = torch.tensor([exact_fisher(*t) for t in tables], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


def test_information_gain_is_mutual_information():
    tables = torch.tensor([[3, 0, 0, 5], [2, 2, 2, 2], [4, 1, 0, 3]], dtype=torch.float64)
    ig = information_gain(tables)
    assert float(ig[0]) == pytest.approx(-(3 / 8) * math.log2(3 / 8) - (5 / 8) * math.log2(5 / 8))  # X determines Y
    assert float(ig[1]) == pytest.approx(0.0, abs=1e-12)  # independent


@pytest.mark.parametrize("frequency", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_key_token_scores_match_loop_reference(seed, frequency):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 12, (8, 10), generator=g)
    lengths = torch.randint(2, 11, (8,), generator=g)
    mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    correct = torch.rand(8, generator=g) > 0.5
    correct[0], correct[1] = True, False
    for alpha, beta, scale in [(1.0, 1.0, 1.0), (1.0, 2.0, 0.5), (0.0, 1.0, 1.0), (1.0, 0.0, 2.0)]:
        got = key_token_scores(ids, mask, correct, alpha, beta, frequency, scale)
        expected = loop_key_scores(ids.tolist(), mask.tolist(), correct.tolist(), alpha, beta, frequency, scale)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_groups_without_both_outcomes_get_no_score():
    ids = torch.randint(0, 5, (4, 6), generator=torch.Generator().manual_seed(0))
    for correct in (torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool)):
        assert torch.equal(key_token_scores(ids, torch.ones(4, 6), correct, 1.0, 1.0), torch.zeros(4, 6, dtype=torch.float64))


def released_ktae(responses, mask, rewards, eos=151643, p_is_one=None):
    """KTAE's released advantage for one group (the reading in the module docstring), in float32.

    The released code maps p = 1 to F = 0 by comparing its float32 p with 1.0 exactly; where the exact p is 1 the
    float32 sum of the table probabilities lands on 1.0 or one ulp beside it depending on the machine's lgamma and exp,
    so that comparison is a discontinuity decided by rounding. ``p_is_one`` (a bool per token id, from the exact
    rational test) decides it as exact arithmetic would; None keeps the released float comparison."""
    correct = rewards > 0
    n_c, n_w = int(correct.sum()), int((~correct).sum())
    scores = rewards.float()
    grpo = (scores - scores.mean()) / (scores.std() + 1e-6)
    key = torch.zeros(int(responses.max()) + 1)
    if n_c and n_w:
        table = torch.zeros(int(responses.max()) + 1, 4)
        for v in set(responses.flatten().tolist()):
            a = sum(int(((responses[i] == v) & (mask[i] == 1)).any()) for i in range(len(rewards)) if correct[i])
            b = sum(int(((responses[i] == v) & (mask[i] == 1)).any()) for i in range(len(rewards)) if not correct[i])
            if a + b:
                table[v] = torch.tensor([a, b, n_c - a, n_w - b], dtype=torch.float32)
        a, b, c, d = table.unbind(1)
        r1, c1, n = a + b, a + c, a + b + c + d

        def lc(x, y):
            return torch.lgamma(x + 1) - torch.lgamma(y + 1) - torch.lgamma(x - y + 1)

        ks = torch.arange(int(torch.minimum(r1, c1).max()) + 1, dtype=torch.float32)[None, :].expand(len(a), -1)
        inside = (ks >= (r1 + c1 - n).clamp_min(0)[:, None]) & (ks <= torch.minimum(r1, c1)[:, None])
        pk = torch.exp(lc(c1[:, None], ks) + lc((n - c1)[:, None], r1[:, None] - ks) - lc(n, r1)[:, None]) * inside
        pobs = torch.exp(lc(c1, a) + lc(n - c1, r1 - a) - lc(n, r1))
        p = torch.where((pk <= pobs[:, None]) & inside, pk, 0.0).sum(1)
        one = (p == 1.0) if p_is_one is None else p_is_one[: len(p)]
        fisher = torch.where(~one, torch.exp(-2 * p), 0.0)

        def ent(q):
            return -q * torch.where(q > 0, torch.log2(q), 0.0)

        def cond(x, y):
            tot = x + y
            return torch.where(tot > 0, ent(x / tot) + ent(y / tot), 0.0)

        ig = ent((a + c) / n) + ent((b + d) / n) - ((a + b) / n * cond(a, b) + (c + d) / n * cond(c, d))
        ig[n == 0] = 0
        tok_c, tok_w = responses[correct][mask[correct] == 1], responses[~correct][mask[~correct] == 1]
        avg = (tok_c.numel() + tok_w.numel()) / 2
        tf = []
        for tok in (tok_c, tok_w):
            f = torch.bincount(tok, minlength=len(a)).float() / tok.numel()
            tf.append(f * 3.0 / (f + 2.0 * (0.5 + 0.5 * tok.numel() / avg)))
        h = torch.asin(torch.sqrt((a / (a + c + 1e-10)).clamp(0, 1))) - torch.asin(torch.sqrt((b / (b + d + 1e-10)).clamp(0, 1)))
        x = h + tf[0] / (tf[1] + 1e-5) - tf[1] / (tf[0] + 1e-5)
        key = (torch.sigmoid((fisher + ig) * x / 2) - 0.5) * 2
        if eos < len(key):
            key[eos] = 0.0
    return grpo[:, None] * mask + key[responses] * mask


def test_reproduces_the_released_advantages_on_fixed_inputs():
    """Fixed inputs: 6 completions of 8 positions, token ids 0-9 plus 151643 (Qwen2.5's <|endoftext|>, which the
    released code zeroes; passed here as ``ignored_token_ids``), rewards 1 1 1 0 0 0 (binary, as in the paper)."""
    responses = torch.tensor([
        [1, 2, 3, 4, 151643, 151643, 151643, 151643],
        [1, 2, 5, 4, 6, 151643, 151643, 151643],
        [1, 3, 3, 4, 2, 151643, 151643, 151643],
        [1, 7, 8, 9, 7, 8, 9, 7],
        [1, 7, 5, 4, 151643, 151643, 151643, 151643],
        [2, 8, 8, 0, 6, 151643, 151643, 151643],
    ])
    mask = (torch.tensor([5, 6, 6, 8, 5, 6])[:, None] > torch.arange(8)[None, :]).long()
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    p_is_one = exact_p_is_one(responses, mask, rewards > 0)
    released = released_ktae(responses, mask, rewards, p_is_one=p_is_one)
    grpo = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    ours = grpo[:, None] * mask + key_token_scores(responses, mask, rewards > 0, 1.0, 1.0, True, 1.0,
                                                   ignored_token_ids=(151643,)).float() * mask
    torch.testing.assert_close(ours, released, rtol=1e-5, atol=1e-5)
    # The released float comparison itself: it differs from ours at most on the tokens whose exact p is 1 (whichever
    # way this machine's float32 rounds there), and at most by what F = exp(-2 p) instead of 0 changes there.
    as_released = released_ktae(responses, mask, rewards)
    at_p_one = p_is_one[responses] & mask.bool()
    assert int(at_p_one.sum()) > 0  # the inputs have such tokens (ids 1, 2, 8 and the like)
    torch.testing.assert_close(as_released[~at_p_one], ours[~at_p_one], rtol=1e-5, atol=1e-5)
    f_not_zero = released_ktae(responses, mask, rewards, p_is_one=torch.zeros_like(p_is_one))
    bound = float((f_not_zero - released).abs()[at_p_one].max())
    assert 0.005 < bound < 0.1  # the size documented in docs/methods.md §11.4 (0.058 here)
    assert float((as_released - ours).abs()[at_p_one].max()) <= bound + 1e-5
    # a key token: 4 is in all 3 correct completions and 1 incorrect one, 7 and 9 only in incorrect ones
    key = key_token_scores(responses, mask, rewards > 0, 1.0, 1.0)
    assert key[0, 3] > 0 and key[3, 1] < 0 and key[3, 3] < 0


def exact_p_is_one(responses, mask, correct) -> torch.Tensor:
    """Per token id: whether the exact (rational) two-sided Fisher p-value of its 2 x 2 table in the group is 1."""
    n_c, n_w = int(correct.sum()), int((~correct).sum())
    out = torch.zeros(int(responses.max()) + 1, dtype=torch.bool)
    for v in set(responses.flatten().tolist()):
        present = [bool(((responses[i] == v) & (mask[i] == 1)).any()) for i in range(len(correct))]
        a = sum(p for p, c in zip(present, correct.tolist(), strict=True) if c)
        b = sum(p for p, c in zip(present, correct.tolist(), strict=True) if not c)
        if a + b:
            out[v] = exact_fisher(a, b, n_c - a, n_w - b) == 1
    return out


def test_strategy_adds_scores_per_group_and_checks_alpha_plus_beta():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 9, (8, 5), generator=g)
    mask = torch.ones(8, 5)
    correct = torch.tensor([True, False, True, False, True, True, True, True])
    advantages = torch.randn(8, 5, generator=g)
    batch = GenerationBatch(None, mask, ids, advantages, correct.float(), torch.tensor([0] * 4 + [1] * 4), 4,
                            correct=correct)
    out, metrics = STRATEGIES.get("ktae")(StrategyParams()).token_advantages(batch)
    expected = advantages.clone()
    expected[:4] += key_token_scores(ids[:4], mask[:4], correct[:4], 1.0, 1.0).float()
    torch.testing.assert_close(out, expected)  # the all-correct second group is unchanged
    assert metrics["ktae/frac_groups_scored"] == 0.5
    with pytest.raises(ConfigError, match="ktae_alpha=0, ktae_beta=0"):
        STRATEGIES.get("ktae").check_params(StrategyParams(ktae_alpha=0.0, ktae_beta=0.0))


def test_ktae_scale_zero_is_declared_inert(tmp_path):
    from helpers import cpu_config

    ktae = STRATEGIES.get("ktae")
    assert ktae.inert(cpu_config(tmp_path)) is None
    assert "ktae_scale=0" in ktae.inert(cpu_config(tmp_path, ktae_scale=0.0))
