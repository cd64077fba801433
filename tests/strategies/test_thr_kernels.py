"""The fused THR kernel (sharpgrpo/strategies/thr_kernels.py) against the float64 loop reference of test_thr.py:
exact to 1e-5 relative (scores, per-completion sums, threshold, entropies), whatever the vocabulary tiling, and
with per-token relative accuracy on peaked distributions (q(y) close to 1)."""

from __future__ import annotations

import pytest
import torch
from test_thr import V, assert_scores_close, make_group, reference_scores

from sharpgrpo.strategies.thr import token_hidden_reward_scores
from sharpgrpo.strategies.thr_kernels import use_fused


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("chunk_size", [1, 7, 10**6])  # vocabulary tiles of 1 id, of a few ids, and one tile
def test_fused_matches_float64_reference(seed, chunk_size):
    hidden, ids, mask, positive, weight, bias = make_group(20 + seed, bias=seed != 1)
    temperature = [1.0, 0.7, 1.3][seed]
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, temperature, "full", chunk_size,
                                        compute_entropy=True, method="fused", beta=1.3)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, temperature, beta=1.3)
    assert_scores_close(result, reference, mask)


def test_fused_unnormalised_scores_match_reference():
    hidden, ids, mask, positive, weight, bias = make_group(30, G=5)
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, 0.9, length_normalized=False,
                                        method="fused", chunk_size=5)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 0.9, length_normalized=False)
    assert_scores_close(result, reference, mask)


def test_fused_peaked_distributions_keep_per_token_relative_accuracy():
    hidden, ids, mask, positive, weight, bias = make_group(12, logit_scale=30.0)
    ids = (hidden @ weight.T + bias).argmax(-1)  # the sampled token is the mode: q(y) close to 1
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="fused", chunk_size=3)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 1.0)[0]
    valid = mask.bool()
    assert float(reference[valid].abs().min()) < 1e-12 * float(reference[valid].abs().max())
    torch.testing.assert_close(result.scores.double()[valid], reference[valid], rtol=1e-3, atol=0.0)


def test_fused_bfloat16_products_are_close_and_auto_uses_fused_on_long_groups():
    hidden, ids, mask, positive, weight, bias = make_group(13)
    exact = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="factored")
    approx = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, method="fused",
                                        matmul_dtype=torch.bfloat16)
    scale = float(exact.scores.abs().max())
    torch.testing.assert_close(approx.scores, exact.scores, rtol=0.05, atol=0.05 * scale)
    # auto: pairwise for short groups (fewer flops), fused for long ones and never for the sampled vocabulary
    assert not use_fused("auto", "full", 64, 32, 1536, 151936, 1024)
    assert use_fused("auto", "full", 32768, 16384, 1536, 151936, 1024)
    assert not use_fused("auto", "sampled", 32768, 16384, 1536, 151936, 1024)
    with pytest.raises(ValueError, match="vocab='full'"):
        token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, vocab="sampled", method="fused")
    assert V == weight.shape[0]
