"""ECHO (docs/methods.md §18.7) against prime-rl's released ``echo`` algorithm and ``ce`` loss component.

The reference is a float64 loop doing what PrimeIntellect-ai/prime-rl@559b447 does (its modules import the
``verifiers`` package and its trainer's CUDA setup, so they cannot be imported here): ``echo.py``
``_weight_observations`` L41-90 gives each non-sampled token after the first model response its role's ``alpha``
(the default table: ``tool`` at 0.1, ``algorithm.py`` L113-130, L211-225); ``loss.py`` ``ce_loss_fn`` L246-259 sums
-logp * weight over the tokens whose weight is not 0, and ``compute_loss`` L387-394 adds it divided by ``ce_scale``,
the count of those tokens (``train.py`` L308-323, at least 1), to the rl component. In a TRL completion the
environment's tokens are those with ``tool_mask`` 0 (all after the model's first tokens). The test runs the
trainer's own loss function (``policy_loss`` with the config's ``StrategySet``) and checks the loss and its gradient
with respect to the log-probabilities. With roles and a filter the reference walks each completion as prime-rl's
branch of message nodes (role, sampled or not, tokens), the filter's keep-mask over the branch's token ids
(``_filter_masks`` L92-110) narrowing the role selection (L67-77).
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


def loss_of(args, logps, tool_mask, completion_mask, advantages, env=True, env_roles=None, completion_ids=None):
    from accelerate import Accelerator

    logps = logps.clone().requires_grad_(True)
    loss_batch = LossBatch(logps, torch.zeros_like(logps), completion_mask * tool_mask, advantages,
                           env_mask=completion_mask * (1 - tool_mask) if env else None,
                           num_items_in_batch=(completion_mask * tool_mask).sum(), env_roles=env_roles,
                           completion_ids=completion_ids)
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


ROLES = ("system", "user", "assistant", "tool")


def keep_odd_tokens(token_ids):
    """An echo filter (imported by path in the tests): keep the tokens with an odd id."""
    return [token % 2 == 1 for token in token_ids]


def released_weighted_ce(logps, branches, role_weights, keep=None):
    """prime-rl's ce component over branches of nodes: ``_weight_observations`` L58-80 (a node's tokens get its role's
    weight when a sampled node came before, the node is not sampled and its role is in the table, and the filter's
    keep-mask allows the token), then ``ce_loss_fn`` summed over the tokens with a weight, / ce_scale (their count)."""
    total, count = 0.0, 0
    for branch_idx, nodes in enumerate(branches):
        token_ids = [token for _, _, ids in nodes for token in ids]
        weights = [0.0] * len(token_ids)
        keep_mask = keep(token_ids) if keep is not None else None
        offset, seen_response = 0, False
        for role, sampled, ids in nodes:
            span = len(ids)
            if seen_response and not sampled and role in role_weights:
                for i in range(offset, offset + span):
                    if keep_mask is None or keep_mask[i]:
                        weights[i] = role_weights[role]
            if sampled:
                seen_response = True
            offset += span
        for t, weight in enumerate(weights):
            if weight != 0:
                total += -float(logps[branch_idx, t]) * weight
                count += 1
    return total / max(count, 1)


def branch_batch(seed: int, rows: int = 6, length: int = 14):
    """Completions as prime-rl branches: a model turn, then environment messages (tool results, user feedback) and
    model turns in random order; as sharpgrpo's tensors: tool_mask 0 and the role's code on the environment's."""
    g = torch.Generator().manual_seed(seed)
    branches, tool_mask = [], torch.ones(rows, length, dtype=torch.float64)
    env_roles = torch.zeros(rows, length, dtype=torch.long)
    ids = torch.randint(0, 50, (rows, length), generator=g)
    completion_mask = torch.zeros(rows, length, dtype=torch.float64)
    for i in range(rows):
        nodes, t = [], 0
        while t < length - 1:
            span = min(int(torch.randint(1, 4, (1,), generator=g)), length - 1 - t)
            sampled = not nodes or not nodes[-1][1]  # model turns and environment messages alternate
            role = "assistant" if sampled else ROLES[int(torch.randint(1, 4, (1,), generator=g))]
            nodes.append((role, sampled, ids[i, t:t + span].tolist()))
            if not sampled:
                tool_mask[i, t:t + span] = 0
                env_roles[i, t:t + span] = ROLES.index(role) + 1
            t += span
        completion_mask[i, :t] = 1
        branches.append(nodes)
    logps = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 4
    advantages = torch.randn(rows, 1, generator=g, dtype=torch.float64)
    return logps, tool_mask, completion_mask, advantages, env_roles, ids, branches


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize(("roles", "table", "with_filter"), [
    ("tool", {"tool": 0.1}, False), ("tool=0.1,user=0.05", {"tool": 0.1, "user": 0.05}, False),
    ("user=0.3", {"user": 0.3}, True), ("tool, user=0.05, assistant=0.2", {"tool": 0.1, "user": 0.05,
                                                                          "assistant": 0.2}, True)])
def test_roles_and_filter_match_prime_rls_weighting(tmp_path, seed, roles, table, with_filter):
    """The role table (a role without alpha takes echo_coef 0.1) and a filter imported by path against prime-rl's
    weighting of the same completions as branches of message nodes: the loss difference (1e-9) and the gradient,
    -alpha_role / ce_scale on each selected token, 0 on every other (1e-9)."""
    logps, tool_mask, completion_mask, advantages, env_roles, ids, branches = branch_batch(seed)
    echo = cpu_config(tmp_path, strategies=["grpo_sg", "echo"], echo_roles=roles, num_generations=2,
                      per_device_train_batch_size=2, echo_filter="test_echo:keep_odd_tokens" if with_filter else None)
    plain = cpu_config(tmp_path, num_generations=2, per_device_train_batch_size=2)
    with_echo, grad_echo = loss_of(echo, logps, tool_mask, completion_mask, advantages, env_roles=env_roles,
                                   completion_ids=ids)
    without, grad_plain = loss_of(plain, logps, tool_mask, completion_mask, advantages)
    expected = released_weighted_ce(logps, branches, table, keep_odd_tokens if with_filter else None)
    assert float((with_echo.loss - without.loss).detach()) == pytest.approx(expected, abs=1e-9)
    alpha = torch.tensor([0.0] + [table.get(role, 0.0) for role in ROLES], dtype=torch.float64)[env_roles]
    alpha = alpha * completion_mask * (1 - tool_mask)
    if with_filter:
        alpha = alpha * (ids % 2 == 1)
    torch.testing.assert_close(grad_echo - grad_plain, -alpha / (alpha != 0).sum().clamp(min=1), rtol=0, atol=1e-9)
    assert float(with_echo.metrics["echo/env_tokens"]) == (alpha != 0).sum().item()
    assert (alpha != 0).any() and ((completion_mask * (1 - tool_mask)).bool() & (alpha == 0)).any()


def test_role_and_filter_controls_differ(tmp_path):
    """Every environment token at echo_coef (no roles), or the filter's tokens dropped but the role-selected count
    kept as the normaliser, miss prime-rl's weighting."""
    logps, tool_mask, completion_mask, advantages, env_roles, ids, branches = branch_batch(0)
    table = {"tool": 0.1, "user": 0.05}
    expected = released_weighted_ce(logps, branches, table, keep_odd_tokens)
    env = completion_mask * (1 - tool_mask)
    no_roles = float((-0.1 * logps * env).sum() / env.sum())
    alpha = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.1], dtype=torch.float64)[env_roles] * env
    kept = alpha * (ids % 2 == 1)
    role_count = float((-logps * kept).sum() / (alpha != 0).sum())
    assert abs(no_roles - expected) > 1e-4 and abs(role_count - expected) > 1e-4


def wrong_length_filter(token_ids):
    return [True] * (len(token_ids) + 1)


def test_bad_roles_and_filters_are_refused_in_one_line(tmp_path):
    def config(**fields):
        return cpu_config(tmp_path, strategies=["grpo_sg", "echo"], num_generations=2, per_device_train_batch_size=2,
                          **fields)

    for fields, message in [({"echo_roles": "tool,observation"}, "unknown role 'observation'"),
                            ({"echo_roles": "tools"}, "did you mean tool"),
                            ({"echo_roles": "tool=0"}, "alpha must be a finite number > 0"),
                            ({"echo_roles": "tool,tool=0.2"}, "given twice"),
                            ({"echo_roles": " , "}, "echo_roles is empty"),
                            ({"echo_filter": "no_such_module_here:keep"}, "Could not import module"),
                            ({"echo_filter": "test_echo:ROLES"}, "is not callable")]:
        with pytest.raises(ConfigError, match=message) as error:
            config(**fields)
        assert "\n" not in str(error.value)
    logps, tool_mask, completion_mask, advantages, env_roles, ids, _ = branch_batch(1)
    with pytest.raises(ValueError, match="echo_filter test_echo:wrong_length_filter must return one keep flag per "
                                         "token") as error:
        loss_of(config(echo_filter="test_echo:wrong_length_filter"), logps, tool_mask, completion_mask, advantages,
                env_roles=env_roles, completion_ids=ids)
    assert "\n" not in str(error.value)


def test_rollout_roles_reach_the_loss_inputs():
    """The rollout's per-token role codes (its extra field, copied by TRL into the input rows) become a (B, T) tensor
    padded with 0 beside the completions, and the loss's inputs carry them with the token ids; without them (TRL's
    tool calling) there is none, and echo reads every environment token as a tool result."""
    from sharpgrpo.training.generation.inputs import environment_inputs, environment_roles

    ids = torch.arange(12).view(2, 6)
    output = {"completion_ids": ids, "completion_mask": torch.ones(2, 6), "tool_mask": torch.ones(2, 6)}
    rows = [{"env_roles": [0, 4, 4, 0]}, {"env_roles": [0, 2, 0, 0, 0]}]
    got = environment_roles(rows, output)
    assert got["env_roles"].tolist() == [[0, 4, 4, 0, 0, 0], [0, 2, 0, 0, 0, 0]]
    assert "env_roles" not in environment_roles([{}, {}], output)
    inputs = environment_inputs(got)
    assert torch.equal(inputs["env_roles"], got["env_roles"]) and torch.equal(inputs["completion_ids"], ids)
    assert environment_inputs(output)["env_roles"] is None
