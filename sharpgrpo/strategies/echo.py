"""ECHO: a cross-entropy term on the environment's tokens beside the policy gradient (docs/methods.md §18.7).

Shrivastava et al. 2026, "ECHO: Terminal Agents Learn World Models for Free" (arXiv 2605.24517): in multi-turn agent
rollouts the policy already scores the environment's replies (tool output, retrieved passages) it conditions on; ECHO
trains it to predict them too, with the policy-gradient loss on its own tokens unchanged:

    L = L_policy + sum_{t in env} alpha (-log pi(y_t | y_<t)) / |env|,

the environment tokens normalised by their own count, so they do not dilute the policy loss's denominator. As
prime-rl releases it (PrimeIntellect-ai/prime-rl@559b447): the ``echo`` algorithm weights the non-sampled tokens
after the first model response by their message role's ``alpha`` (``src/prime_rl/orchestrator/algo/echo.py``
``_weight_observations`` L40-94; ``EchoRoleConfig.alpha`` 0.1, the default table ``tool`` only,
``packages/prime-rl-configs/src/prime_rl/configs/algorithm.py`` L113-130 and L211-225); the trainer's ``ce``
component is ``ce_loss_fn`` (``src/prime_rl/trainer/rl/loss.py`` L246-259: sum of -logp * weight over the tokens
with a weight) divided by ``ce_scale``, the number of such tokens (``compute_loss`` L287-394; ``train.py`` L308-323).

Here the environment's tokens are those of a completion with TRL's ``tool_mask`` 0 (``LossContext.env_mask``), and
the term is ``LossTerms.env_loss``, which the loss averages over them apart from the policy loss
(``sharpgrpo.training.loss.terms.environment_token_loss``).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch

from sharpgrpo.strategies.base import LossContext, LossTerms, StrategyPaper, TokenLossStrategy, register_strategy


def echo_token_loss(logps: torch.Tensor, env_mask: torch.Tensor, coef: float) -> torch.Tensor:
    """ECHO's per-token cross-entropy on environment tokens: coef * (-log p) where ``env_mask`` is 1, 0 elsewhere
    (prime-rl ``ce_loss_fn``: nll * loss_weights, weights alpha on the selected tokens). (B, T), (B, T) -> (B, T),
    with ``logps``' graph."""
    return -coef * logps * env_mask.to(logps.dtype)


@register_strategy("echo")
class EchoStrategy(TokenLossStrategy):
    """``echo``: ``echo_coef`` * (-log p) on every environment token (tool results, retrieved passages), averaged over
    them beside the policy loss. Metrics: ``echo/nll`` (mean -log p over the environment tokens) and
    ``echo/env_tokens`` (their number in the micro-batch, averaged over processes). A batch without environment
    tokens (no tools, no multi-turn rollout) is said once: echo then adds nothing."""

    params = ("echo_coef",)
    sets: ClassVar[frozenset[str]] = frozenset({"env_loss"})
    importance_sampling_levels = ("token", "sequence")  # it reads no ratio
    metrics = ("echo/nll", "echo/env_tokens")
    paper = StrategyPaper(
        "ECHO: Terminal Agents Learn World Models for Free",
        "Shrivastava, Kauffmann, Awadallah, Papailiopoulos 2026, ECHO: Terminal Agents Learn World Models for Free "
        "(arXiv:2605.24517)",
        "2605.24517",
    )

    def __init__(self, args: Any):
        super().__init__(args)
        self._said_no_environment = False

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        env_mask = context.env_mask
        if env_mask is None or not bool(env_mask.any()):
            if not self._said_no_environment:
                self._said_no_environment = True
                warnings.warn(
                    "echo: this batch has no environment tokens (no tool_mask 0 in the completions: the run has no "
                    "tools and no multi-turn rollout such as the search setting's), so echo adds nothing; it trains "
                    "on tool results and retrieved passages (said once).", UserWarning, stacklevel=2)
            zero = context.logps.new_zeros(())
            return LossTerms(), {"echo/nll": zero, "echo/env_tokens": zero}
        env_mask = env_mask.to(context.logps.dtype)
        count = env_mask.sum()
        nll = (-context.logps.detach() * env_mask).sum() / count.clamp(min=1.0)
        terms = LossTerms(env_loss=echo_token_loss(context.logps, env_mask, float(self.args.echo_coef)))
        return terms, {"echo/nll": nll, "echo/env_tokens": count}
