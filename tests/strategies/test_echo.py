"""ECHO (docs/methods.md §18.7) against prime-rl's released ``echo`` algorithm and ``ce`` loss component.

The reference is a float64 loop doing what PrimeIntellect-ai/prime-rl@559b447 does (its modules import the
``verifiers`` package and its trainer's CUDA setup, so they cannot be imported here): ``echo.py``
``_weight_observations`` L40-94 gives each non-sampled token after the first model response its role's ``alpha``
(the default table: ``tool`` at 0.1, ``algorithm.py`` L113-130, L211-225); ``loss.py`` ``ce_loss_fn`` L246-259 sums
-logp * weight over the tokens whose weight is not 0, and ``compute_loss`` L387-394 adds it divided by ``ce_scale``,
the count of those tokens (``train.py`` L308-323, at least 1), to the rl component. In a TRL completion the
environment's tokens are those with ``tool_mask`` 0 (all after the model's first tokens). The test runs the
trainer's own loss function (``policy_loss`` with the config's ``StrategySet``) and checks the loss and its gradient
with respect to the log-probabilities.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import cpu_config

from sharpgrpo.training.loss.policy_loss import LossBatch, LossSettings, policy_loss
from sharpgrpo.training.strategy_set import StrategySet
from sharpgrpo.validation import ConfigError


def released_ce(logps, tool_mask, completion_mask, alpha):
    """prime-rl's ce component for one micro-batch: weights from _weight_observations, ce_loss_fn, / ce_scale."""
    total, count = 0.0, 0
    for i in range(logps.size(0)):
        seen_response = False
        for t in range(logps.size(1)):
            if not completion_mask[i, t]:
                continue
            sampled = bool(tool_mask[i, t])
            weight = alpha if (seen_response and not sampled) else 0.0
            if weight != 0:
                total += -float(logps[i, t]) * weight
                count += 1
            seen_response = seen_response or sampled
    return total / max(count, 1)


def batch(seed: int, rows: int = 6, length: int = 10):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, length + 1, (rows,), generator=g)
    completion_mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    tool_mask = torch.ones(rows, length, dtype=torch.float64)
    for i in range(rows - 1):  # one tool result span per row, after the first model tokens; the last row has none
        start = int(torch.randint(1, 3, (1,), generator=g))
        tool_mask[i, start : start + int(torch.randint(1, 4, (1,), generator=g))] = 0
    logps = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 4
    advantages = torch.randn(rows, 1, generator=g, dtype=torch.float64)
    return logps, tool_mask, completion_mask, advantages


def loss_of(args, logps, tool_mask, completion_mask, advantages, env=True):
    from accelerate import Accelerator

    logps = logps.clone().requires_grad_(True)
    loss_batch = LossBatch(logps, torch.zeros_like(logps), completion_mask * tool_mask, advantages,
                           env_mask=completion_mask * (1 - tool_mask) if env else None,
                           num_items_in_batch=(completion_mask * tool_mask).sum())
    settings = LossSettings(loss_type=args.loss_type, epsilon_low=0.2, epsilon_high=0.2, max_completion_length=16)
    result = policy_loss(loss_batch, StrategySet(args), settings, Accelerator(cpu=True))
    result.loss.backward()
    return result, logps.grad


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize(("loss_type", "coef"), [("dapo", 0.1), ("grpo", 0.05), ("dr_grpo", 0.3)])
def test_loss_and_gradient_match_prime_rls_ce_component(tmp_path, seed, loss_type, coef):
    logps, tool_mask, completion_mask, advantages = batch(seed)
    echo = cpu_config(tmp_path, strategies=["grpo_sg", "echo"], echo_coef=coef, loss_type=loss_type, num_generations=2,
                      per_device_train_batch_size=2)
    plain = cpu_config(tmp_path, loss_type=loss_type, num_generations=2, per_device_train_batch_size=2)
    with_echo, grad_echo = loss_of(echo, logps, tool_mask, completion_mask, advantages)
    without, grad_plain = loss_of(plain, logps, tool_mask, completion_mask, advantages)
    expected = released_ce(logps, tool_mask, completion_mask, coef)
    assert float((with_echo.loss - without.loss).detach()) == pytest.approx(expected, abs=1e-9)
    env = completion_mask * (1 - tool_mask)
    expected_grad = -coef * env / env.sum()  # d/d logp of the ce component: -alpha / ce_scale on environment tokens
    torch.testing.assert_close(grad_echo - grad_plain, expected_grad, rtol=0, atol=1e-9)
    torch.testing.assert_close(grad_echo * completion_mask * tool_mask, grad_plain * completion_mask * tool_mask,
                               rtol=0, atol=1e-12)  # the model's own tokens: the policy gradient unchanged
    assert float(with_echo.metrics["echo/env_tokens"]) == env.sum().item()
    assert torch.equal(with_echo.tensors.strategy_terms["echo/env_loss"], -coef * logps * env)


def test_controls_differ(tmp_path):
    """The ce term normalised by the loss tokens (the policy loss's denominator), or over every completion token,
    misses prime-rl's at 1e-9."""
    logps, tool_mask, completion_mask, advantages = batch(0)
    env = completion_mask * (1 - tool_mask)
    expected = released_ce(logps, tool_mask, completion_mask, 0.1)
    by_policy_tokens = float((-0.1 * logps * env).sum() / (completion_mask * tool_mask).sum())
    every_token = float((-0.1 * logps * completion_mask).sum() / completion_mask.sum())
    assert abs(by_policy_tokens - expected) > 1e-3 and abs(every_token - expected) > 1e-3


def test_no_environment_tokens_is_said_once(tmp_path):
    logps, tool_mask, completion_mask, advantages = batch(1)
    args = cpu_config(tmp_path, strategies=["grpo_sg", "echo"], num_generations=2, per_device_train_batch_size=2)
    with pytest.warns(UserWarning, match="echo: this batch has no environment tokens") as caught:
        strategies = StrategySet(args)
        from accelerate import Accelerator

        settings = LossSettings(loss_type=args.loss_type)
        for _ in range(2):
            loss_batch = LossBatch(logps.clone().requires_grad_(True), torch.zeros_like(logps), completion_mask,
                                   advantages, num_items_in_batch=completion_mask.sum())
            result = policy_loss(loss_batch, strategies, settings, Accelerator(cpu=True))
    assert sum("echo:" in str(w.message) for w in caught) == 1
    plain = cpu_config(tmp_path, num_generations=2, per_device_train_batch_size=2)
    without, _ = loss_of(plain, logps, torch.ones_like(tool_mask), completion_mask, advantages, env=False)
    assert float(result.loss) == pytest.approx(float(without.loss), abs=1e-12)


def test_a_sequence_objective_refuses_echo(tmp_path):
    with pytest.raises(ConfigError, match="gmpo"):
        cpu_config(tmp_path, strategies=["echo", "gmpo"], loss_type="grpo", num_generations=2,
                   per_device_train_batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # composes, and without a warning
        cpu_config(tmp_path, strategies=["grpo_sg", "maxrl", "rlsd", "echo", "dppo_tv"], num_generations=2,
                   per_device_train_batch_size=2, num_iterations=2)
