"""CW-GRPO covariance Gaussian-kernel weights (docs/methods.md §2) against an explicit float64 loop reference."""

from __future__ import annotations

import math

import pytest
import torch

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.covariance import CovarianceWeighting, covariance_gaussian_weights
from sharpgrpo.strategy_params import StrategyParams

STAT_KEYS = {
    "cw/weight_mean",
    "cw/weight_min",
    "cw/frac_below_0.5",
    "cw/sigma",
    "cw/kernel_mean",
    "cw/frac_scopes_degenerate",
}


def reference_weights(logps, advantages, mask, scope_ids, sigma_eps=1e-8, advantage_mean="response"):
    """docs/methods.md §2 written out with python loops over scopes and tokens, in float64 python floats. mean(A): each
    response once (its masked token mean; rows without a valid token skipped), or the masked token mean."""
    lp = logps.double().tolist()
    adv = advantages.double().tolist()
    valid = mask.bool().tolist()
    scopes = scope_ids.tolist()
    num_rows, num_cols = logps.shape
    weights = [[1.0] * num_cols for _ in range(num_rows)]
    kernels = {}
    sigmas = []
    degenerate = []
    for scope in sorted(set(scopes)):
        tokens = [(i, t) for i in range(num_rows) if scopes[i] == scope for t in range(num_cols) if valid[i][t]]
        n = len(tokens)
        if n == 0:
            continue
        mean_lp = math.fsum(lp[i][t] for i, t in tokens) / n
        if advantage_mean == "token":
            mean_adv = math.fsum(adv[i][t] for i, t in tokens) / n
        else:
            responses = [i for i in range(num_rows) if scopes[i] == scope and any(valid[i])]
            per_response = [math.fsum(adv[i][t] for t in range(num_cols) if valid[i][t]) / sum(valid[i])
                            for i in responses]
            mean_adv = math.fsum(per_response) / len(per_response)
        cov = {(i, t): (lp[i][t] - mean_lp) * (adv[i][t] - mean_adv) for i, t in tokens}
        mean_cov = math.fsum(cov.values()) / n
        sigma = math.sqrt(math.fsum((c - mean_cov) ** 2 for c in cov.values()) / n)
        sigmas.append(sigma)
        degenerate.append(sigma < sigma_eps)
        if sigma < sigma_eps:
            kernel = {key: 1.0 for key in tokens}
        else:
            kernel = {key: math.exp(-(c**2) / (2 * sigma**2)) for key, c in cov.items()}
        total = math.fsum(kernel.values())
        for i, t in tokens:
            weights[i][t] = kernel[(i, t)] * n / total
        kernels.update(kernel)
    valid_weights = [weights[i][t] for i in range(num_rows) for t in range(num_cols) if valid[i][t]]
    stats = {}
    if valid_weights:
        stats = {
            "cw/weight_mean": math.fsum(valid_weights) / len(valid_weights),
            "cw/weight_min": min(valid_weights),
            "cw/frac_below_0.5": sum(w < 0.5 for w in valid_weights) / len(valid_weights),
            "cw/sigma": math.fsum(sigmas) / len(sigmas),
            "cw/kernel_mean": math.fsum(kernels.values()) / len(kernels),
            "cw/frac_scopes_degenerate": sum(degenerate) / len(degenerate),
        }
    return torch.tensor(weights, dtype=torch.float64), stats


def make_groups(num_groups, group_size, max_len, seed, *, rewards="binary", lengths="random", ties=False,
                logp_scale=5.0, dtype=torch.float32, token_advantages=False):
    """Random whole groups laid out as TRL does: consecutive rows per group, right padded, A broadcast over T."""
    gen = torch.Generator().manual_seed(seed)
    rows = num_groups * group_size
    if ties:
        logps = -torch.randint(0, 3, (rows, max_len), generator=gen).double()
    else:
        logps = -torch.rand(rows, max_len, generator=gen, dtype=torch.float64) * logp_scale
    if lengths == "random":
        lens = torch.randint(1, max_len + 1, (rows,), generator=gen)
    elif lengths == "with_empty":
        lens = torch.randint(0, max_len + 1, (rows,), generator=gen)
    else:
        lens = torch.full((rows,), max_len)
    mask = (torch.arange(max_len)[None, :] < lens[:, None]).long()
    if rewards == "binary":
        reward = torch.randint(0, 2, (rows,), generator=gen).double()
    elif rewards == "graded":
        reward = torch.randn(rows, generator=gen, dtype=torch.float64)
    else:
        reward = torch.ones(rows, dtype=torch.float64)
    grouped = reward.view(num_groups, group_size)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    advantages = adv[:, None].expand(rows, max_len).clone()
    if token_advantages:
        advantages = advantages * (0.5 + torch.rand(rows, max_len, generator=gen, dtype=torch.float64))
    group_ids = torch.arange(num_groups).repeat_interleave(group_size)
    return logps.to(dtype), advantages.to(dtype), mask, group_ids


def assert_matches_reference(logps, advantages, mask, scope_ids, sigma_eps=1e-8, advantage_mean="response"):
    weights, stats = covariance_gaussian_weights(logps, advantages, mask, scope_ids, sigma_eps=sigma_eps,
                                                 advantage_mean=advantage_mean)
    expected, expected_stats = reference_weights(logps, advantages, mask, scope_ids, sigma_eps, advantage_mean)
    assert weights.shape == logps.shape
    assert weights.dtype == logps.dtype
    tol = 1e-12 if logps.dtype == torch.float64 else 2e-6
    torch.testing.assert_close(weights.double(), expected, rtol=tol, atol=tol)
    assert set(stats) == STAT_KEYS
    for key, value in expected_stats.items():
        assert isinstance(stats[key], float)
        assert stats[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    return weights, stats


@pytest.mark.parametrize("num_groups,group_size,max_len", [(1, 2, 1), (1, 4, 7), (3, 8, 13), (2, 12, 5), (5, 3, 20)])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_loop_reference_per_group(num_groups, group_size, max_len, seed, dtype):
    logps, advantages, mask, group_ids = make_groups(num_groups, group_size, max_len, seed, dtype=dtype)
    assert_matches_reference(logps, advantages, mask, group_ids)


@pytest.mark.parametrize(
    "options",
    [
        {"rewards": "graded"},
        {"ties": True},
        {"ties": True, "rewards": "graded", "lengths": "full"},
        {"lengths": "with_empty"},
        {"token_advantages": True},
        {"logp_scale": 1e4},
        {"logp_scale": 1e-3},
    ],
)
@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("advantage_mean", ["response", "token"])
def test_matches_loop_reference_variants(options, seed, advantage_mean):
    logps, advantages, mask, group_ids = make_groups(4, 6, 9, seed, dtype=torch.float64, **options)
    assert_matches_reference(logps, advantages, mask, group_ids, advantage_mean=advantage_mean)


@pytest.mark.parametrize("seed", [0, 5, 6])
def test_matches_loop_reference_batch_scope(seed):
    logps, advantages, mask, _ = make_groups(3, 5, 8, seed, rewards="graded", dtype=torch.float64)
    one_scope = torch.zeros(logps.shape[0], dtype=torch.long)
    batch_weights, _ = assert_matches_reference(logps, advantages, mask, one_scope)
    group_weights, _ = covariance_gaussian_weights(logps, advantages, mask, torch.arange(3).repeat_interleave(5))
    assert not torch.allclose(batch_weights, group_weights)  # the scope matters


def test_scope_ids_need_not_be_consecutive_or_sorted():
    logps, advantages, mask, group_ids = make_groups(3, 4, 6, 7, rewards="graded", dtype=torch.float64)
    relabel = torch.tensor([42, -3, 7])[group_ids]
    order = torch.randperm(len(relabel), generator=torch.Generator().manual_seed(0))
    assert_matches_reference(logps[order], advantages[order], mask[order], relabel[order])


def test_token_means_are_length_weighted():
    """advantage_mean="token": with broadcast A[i], mean(A) is the length-weighted token mean, not the per-response
    mean (here 0), which is the default."""
    logps = torch.tensor([[-1.0, 0.0, 0.0], [-0.5, -2.0, -0.1]], dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    weights, stats = covariance_gaussian_weights(logps, advantages, mask, torch.zeros(2, dtype=torch.long),
                                                 advantage_mean="token")
    # mean(logp) = -0.9, mean(A) = (1 - 3)/4 = -0.5 -> c = (logp + 0.9) * (A + 0.5)
    cov = [-0.15, -0.2, 0.55, -0.4]
    mean_cov = sum(cov) / 4
    sigma = math.sqrt(sum((c - mean_cov) ** 2 for c in cov) / 4)
    kernel = [math.exp(-(c**2) / (2 * sigma**2)) for c in cov]
    expected = [k * 4 / sum(kernel) for k in kernel]
    got = [weights[0, 0].item(), *weights[1].tolist()]
    assert got == pytest.approx(expected, rel=1e-12)
    assert stats["cw/sigma"] == pytest.approx(sigma, rel=1e-12)
    # The per-response mean (A-bar = 0) would give other weights.
    cov_response_mean = [(-1.0 + 0.9) * 1.0, (-0.5 + 0.9) * -1.0, (-2.0 + 0.9) * -1.0, (-0.1 + 0.9) * -1.0]
    mean_other = sum(cov_response_mean) / 4
    sigma_other = math.sqrt(sum((c - mean_other) ** 2 for c in cov_response_mean) / 4)
    kernel_other = [math.exp(-(c**2) / (2 * sigma_other**2)) for c in cov_response_mean]
    other = [k * 4 / sum(kernel_other) for k in kernel_other]
    assert max(abs(a - b) for a, b in zip(got, other)) > 0.05
    default, _ = covariance_gaussian_weights(logps, advantages, mask, torch.zeros(2, dtype=torch.long))
    assert [default[0, 0].item(), *default[1].tolist()] == pytest.approx(other, rel=1e-12)
    # A (B,) advantage is broadcast exactly like the (B, T) one.
    one_scope = torch.zeros(2, dtype=torch.long)
    broadcast, _ = covariance_gaussian_weights(logps, advantages[:, None].expand(2, 3), mask, one_scope,
                                               advantage_mean="token")
    torch.testing.assert_close(weights, broadcast, rtol=0, atol=0)


def test_group_weights_do_not_depend_on_wrong_answer_lengths():
    """Effect of docs/methods.md §2: a group whose wrong answers are k times longer (the same per-token log-probs,
    tiled) gives its correct answers the same weights with advantage_mean="response"; with "token" it does not."""
    pattern = torch.tensor([-0.05, -2.5, -0.4, -1.2], dtype=torch.float64)
    correct_rows, wrong_rows = 2, 2
    advantages = torch.tensor([1.0] * correct_rows + [-1.0] * wrong_rows, dtype=torch.float64)

    def group(k):
        width = 4 * k
        logps = torch.zeros(4, width, dtype=torch.float64)
        mask = torch.zeros(4, width, dtype=torch.long)
        logps[:correct_rows, :4], mask[:correct_rows, :4] = pattern, 1
        logps[correct_rows:], mask[correct_rows:] = pattern.repeat(k), 1
        return logps, mask

    means = {}
    for mode in ("response", "token"):
        for k in (1, 6):
            logps, mask = group(k)
            weights, _ = covariance_gaussian_weights(logps, advantages, mask, torch.zeros(4, dtype=torch.long),
                                                     advantage_mean=mode)
            means[mode, k] = weights[:correct_rows, :4]
    torch.testing.assert_close(means["response", 1], means["response", 6], rtol=1e-12, atol=1e-12)
    assert (means["token", 1] - means["token", 6]).abs().max() > 0.05  # the old default depends on the lengths
    print("correct-answer mean weight, wrong answers x1 / x6 longer: response",
          float(means["response", 1].mean()), float(means["response", 6].mean()),
          "| token", float(means["token", 1].mean()), float(means["token", 6].mean()))


def test_all_equal_rewards_give_unit_weights():
    logps, advantages, mask, group_ids = make_groups(3, 8, 10, 11, rewards="equal")
    assert torch.all(advantages == 0)
    weights, stats = assert_matches_reference(logps, advantages, mask, group_ids)
    assert torch.all(weights == 1)
    assert stats["cw/frac_scopes_degenerate"] == 1.0
    assert stats["cw/sigma"] == 0.0
    # Constant non-zero advantages are as degenerate: A - mean(A) = 0.
    weights, _ = covariance_gaussian_weights(logps, torch.full_like(advantages, 0.7), mask, group_ids)
    assert torch.all(weights == 1)


def test_degenerate_group_next_to_informative_group():
    logps, advantages, mask, group_ids = make_groups(2, 6, 8, 12, rewards="graded", dtype=torch.float64)
    advantages[:6] = 0.0  # group 0: all rewards equal
    weights, stats = assert_matches_reference(logps, advantages, mask, group_ids)
    assert torch.all(weights[:6] == 1)
    assert not torch.all(weights[6:][mask[6:].bool()] == 1)
    assert stats["cw/frac_scopes_degenerate"] == 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_single_token_completions(dtype):
    # Two one-token completions: every c of the group is the same value, so sigma = 0 and w = 1.
    logps = torch.tensor([[-0.3], [-2.1], [-1.0], [-0.2]], dtype=dtype)
    advantages = torch.tensor([[0.7], [-0.7], [1.0], [-1.0]], dtype=dtype)
    mask = torch.ones(4, 1, dtype=torch.long)
    weights, _ = assert_matches_reference(logps, advantages, mask, torch.tensor([0, 0, 1, 1]))
    assert torch.all(weights == 1)
    # Eight one-token completions in one group: an ordinary, non-trivial case.
    logps, advantages, mask, group_ids = make_groups(1, 8, 1, 13, rewards="graded", dtype=dtype)
    weights, _ = assert_matches_reference(logps, advantages, mask, group_ids)
    assert not torch.all(weights == 1)


def test_weights_follow_rows_under_permutation():
    logps, advantages, mask, group_ids = make_groups(4, 6, 11, 14, rewards="graded", dtype=torch.float64)
    weights, stats = covariance_gaussian_weights(logps, advantages, mask, group_ids)
    order = torch.randperm(logps.shape[0], generator=torch.Generator().manual_seed(1))
    permuted, permuted_stats = covariance_gaussian_weights(
        logps[order], advantages[order], mask[order], group_ids[order]
    )
    torch.testing.assert_close(permuted, weights[order], rtol=1e-12, atol=1e-12)
    assert permuted_stats == pytest.approx(stats, rel=1e-12)


def test_group_weights_depend_only_on_the_group():
    """Per-group scope: a group's weights do not change with the other groups of the batch."""
    logps, advantages, mask, group_ids = make_groups(4, 5, 9, 15, rewards="graded", dtype=torch.float64)
    weights, _ = covariance_gaussian_weights(logps, advantages, mask, group_ids)
    first, _ = covariance_gaussian_weights(logps[:10], advantages[:10], mask[:10], group_ids[:10])
    last, _ = covariance_gaussian_weights(logps[10:], advantages[10:], mask[10:], group_ids[10:])
    torch.testing.assert_close(torch.cat([first, last]), weights, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scope", ["group", "batch"])
@pytest.mark.parametrize("seed", [16, 17, 18])
def test_renormalised_mean_is_one_per_scope(scope, seed):
    logps, advantages, mask, group_ids = make_groups(5, 7, 12, seed, rewards="graded", lengths="with_empty")
    scope_ids = group_ids if scope == "group" else torch.zeros_like(group_ids)
    weights, stats = covariance_gaussian_weights(logps, advantages, mask, scope_ids)
    valid = mask.bool()
    for value in scope_ids.unique():
        in_scope = valid & (scope_ids == value)[:, None]
        if in_scope.any():
            assert weights[in_scope].double().mean().item() == pytest.approx(1.0, abs=1e-6)
    assert stats["cw/weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert torch.all(weights[~valid] == 1)  # masked positions: weight 1


def test_masked_values_are_ignored_and_finite():
    logps, advantages, mask, group_ids = make_groups(3, 4, 8, 19, rewards="graded", dtype=torch.float64)
    weights, _ = covariance_gaussian_weights(logps, advantages, mask, group_ids)
    garbage_logps = torch.where(mask.bool(), logps, torch.tensor(float("-inf"), dtype=torch.float64))
    garbage_adv = torch.where(mask.bool(), advantages, torch.tensor(float("nan"), dtype=torch.float64))
    garbage_weights, _ = covariance_gaussian_weights(garbage_logps, garbage_adv, mask, group_ids)
    torch.testing.assert_close(garbage_weights, weights, rtol=0, atol=0)


def test_degenerate_inputs_are_finite():
    # A group with no valid token at all, next to an ordinary group.
    logps, advantages, mask, group_ids = make_groups(2, 4, 6, 20, rewards="graded")
    mask[:4] = 0
    weights, stats = assert_matches_reference(logps, advantages, mask, group_ids)
    assert torch.all(weights[:4] == 1) and torch.isfinite(weights).all()
    # Nothing valid in the whole batch.
    weights, stats = covariance_gaussian_weights(logps, advantages, torch.zeros_like(mask), group_ids)
    assert torch.all(weights == 1)
    assert all(math.isfinite(value) for value in stats.values())
    # Empty batch and empty completions.
    for rows, cols in ((0, 5), (3, 0)):
        zeros = torch.zeros(rows, cols)
        weights, _ = covariance_gaussian_weights(zeros, zeros, zeros, torch.zeros(rows, dtype=torch.long))
        assert weights.shape == (rows, cols)
    # Very large magnitudes.
    for scale in (1e4, 1e8):
        logps, advantages, mask, group_ids = make_groups(2, 8, 10, 21, rewards="graded", logp_scale=scale)
        weights, stats = covariance_gaussian_weights(logps, advantages * 1e3, mask, group_ids)
        assert torch.isfinite(weights).all() and all(math.isfinite(value) for value in stats.values())
        assert stats["cw/weight_mean"] == pytest.approx(1.0, abs=1e-6)


def test_kernel_underflow_stays_finite_and_exact():
    """All c of the group near one value far from 0: every exp(-c^2/2sigma^2) underflows, yet w~ is defined."""
    gen = torch.Generator().manual_seed(22)
    noise = 1e-3 * torch.rand(2, 6, generator=gen, dtype=torch.float64)
    logps = torch.stack([50.0 + noise[0], -50.0 - noise[1]])  # mean(logp) ~ 0
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)  # c = |logp - mean| ~ 50, sigma ~ 3e-4
    mask = torch.ones(2, 6, dtype=torch.long)
    scope = torch.zeros(2, dtype=torch.long)
    weights, stats = covariance_gaussian_weights(logps, advantages, mask, scope)
    mean_lp = logps.mean()
    cov = ((logps - mean_lp) * advantages[:, None]).flatten().tolist()
    sigma = math.sqrt(sum((c - sum(cov) / 12) ** 2 for c in cov) / 12)
    assert sigma > 1e-8
    assert all(math.exp(-(c**2) / (2 * sigma**2)) == 0.0 for c in cov)  # the printed formula gives 0/0 here
    # w~ is unchanged by a common factor exp(min c^2 / 2 sigma^2): the exact weights, evaluated stably.
    smallest = min(c**2 for c in cov)
    kernel = [math.exp(-(c**2 - smallest) / (2 * sigma**2)) for c in cov]
    expected = torch.tensor([k * 12 / sum(kernel) for k in kernel], dtype=torch.float64).view(2, 6)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights, expected, rtol=1e-9, atol=1e-12)
    assert weights.mean().item() == pytest.approx(1.0)
    assert stats["cw/weight_min"] == pytest.approx(expected.min().item(), abs=1e-12)


def test_no_gradient_flows():
    logps, advantages, mask, group_ids = make_groups(2, 4, 5, 23, rewards="graded")
    logps.requires_grad_(True)
    advantages.requires_grad_(True)
    with torch.enable_grad():
        weights, _ = covariance_gaussian_weights(logps * 1.0, advantages * 1.0, mask, group_ids)
    assert not weights.requires_grad
    assert weights.grad_fn is None


def test_sigma_eps_threshold():
    logps, advantages, mask, group_ids = make_groups(2, 4, 5, 24, rewards="graded", dtype=torch.float64)
    _, stats = covariance_gaussian_weights(logps, advantages, mask, group_ids)
    largest_sigma = stats["cw/sigma"] * 2
    weights, stats = assert_matches_reference(logps, advantages, mask, group_ids, sigma_eps=largest_sigma + 1.0)
    assert torch.all(weights == 1) and stats["cw/frac_scopes_degenerate"] == 1.0
    with pytest.raises(ValueError, match="sigma_eps"):
        covariance_gaussian_weights(logps, advantages, mask, group_ids, sigma_eps=-1.0)


def test_shape_errors():
    logps = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        covariance_gaussian_weights(logps, torch.zeros(2, 4), torch.ones(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="scope_ids"):
        covariance_gaussian_weights(logps, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3, dtype=torch.long))


def make_generation_batch(seed):
    logps, advantages, mask, group_ids = make_groups(3, 4, 7, seed, rewards="graded")
    return GenerationBatch(
        old_logps=logps,
        completion_mask=mask,
        completion_ids=torch.randint(0, 50, logps.shape, generator=torch.Generator().manual_seed(seed)),
        advantages=advantages,
        rewards=advantages[:, 0].clone(),
        group_ids=group_ids,
        num_generations=4,
    )


def test_strategy_is_registered():
    assert STRATEGIES.get("cw_grpo") is CovarianceWeighting
    assert CovarianceWeighting.kind == "advantage"
    assert not CovarianceWeighting.needs_hidden_states


@pytest.mark.parametrize("scope", ["group", "batch", None])
def test_strategy_end_to_end(scope):
    batch = make_generation_batch(25)
    args = StrategyParams() if scope is None else StrategyParams(cw_scope=scope)
    token_advantages, metrics = CovarianceWeighting(args).token_advantages(batch)
    scope_ids = torch.zeros_like(batch.group_ids) if scope == "batch" else batch.group_ids
    expected_weights, expected_stats = reference_weights(
        batch.old_logps, batch.advantages, batch.completion_mask, scope_ids
    )
    assert token_advantages.shape == batch.advantages.shape
    assert token_advantages.dtype == batch.advantages.dtype
    expected = expected_weights * batch.advantages.double()
    torch.testing.assert_close(token_advantages.double(), expected, rtol=2e-6, atol=2e-6)
    assert set(metrics) == STAT_KEYS
    assert metrics["cw/weight_min"] == pytest.approx(expected_stats["cw/weight_min"], rel=1e-6)
    assert metrics["cw/sigma"] == pytest.approx(expected_stats["cw/sigma"], rel=1e-6)
    assert not torch.equal(token_advantages, batch.advantages)


def test_strategy_reads_sigma_eps():
    batch = make_generation_batch(26)
    strategy = CovarianceWeighting(StrategyParams(cw_scope="group", cw_sigma_eps=1e9))
    token_advantages, metrics = strategy.token_advantages(batch)
    torch.testing.assert_close(token_advantages, batch.advantages, rtol=0, atol=0)
    assert metrics["cw/frac_scopes_degenerate"] == 1.0
    with pytest.raises(ValueError, match="cw_sigma_eps"):
        CovarianceWeighting(StrategyParams(cw_sigma_eps=-1.0))


def test_strategy_reads_advantage_mean():
    batch = make_generation_batch(27)
    token_strategy = CovarianceWeighting(StrategyParams(cw_advantage_mean="token"))
    out, _ = token_strategy.token_advantages(batch)
    expected, _ = reference_weights(batch.old_logps, batch.advantages, batch.completion_mask, batch.group_ids,
                                    advantage_mean="token")
    torch.testing.assert_close(out.double(), expected * batch.advantages.double(), rtol=2e-6, atol=2e-6)
    with pytest.raises(ValueError, match="cw_advantage_mean"):
        CovarianceWeighting(StrategyParams(cw_advantage_mean="tokens"))


@pytest.mark.parametrize("bad", ["sequence", "Group", ""])
def test_strategy_rejects_unknown_scope(bad):
    with pytest.raises(ValueError, match=f"^cw_scope='{bad}': must be one of group, batch\\.$"):
        CovarianceWeighting(StrategyParams(cw_scope=bad))
