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
the term is ``LossTerms.env_loss``, which the loss averages over the tokens it covers (``LossTerms.env_mask``) apart
from the policy loss (``sharpgrpo.training.loss.terms.environment_token_loss``).

The role table ``echo_roles`` gives each message role its alpha, as prime-rl's ``EchoRolesConfig``; a token's role is
the rollout's (``LossContext.env_roles``: the search setting's passages ``tool``, its retry message ``user``) or, where
the rollout gives none (TRL's tool calling), ``tool``. The optional ``echo_filter`` (prime-rl's ``EchoFilterConfig``)
narrows the role-selected tokens of each completion: ``keep = filter(token_ids)``, one flag per completion token
(``_filter_masks`` L92-110 asks one keep-mask per trainable branch spanning its token ids).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from sharpgrpo.strategies.base import (
    ENVIRONMENT_ROLES,
    LossContext,
    LossTerms,
    StrategyPaper,
    TokenLossStrategy,
    masked_mean,
    register_strategy,
)


def echo_token_loss(logps: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """ECHO's per-token cross-entropy on environment tokens: alpha * (-log p), ``weights`` alpha on the selected tokens
    and 0 elsewhere (prime-rl ``ce_loss_fn``: nll * loss_weights). (B, T), (B, T) -> (B, T), with ``logps``' graph."""
    return -logps * weights.to(logps.dtype)


def parse_role_table(text: str, default_alpha: float) -> dict[str, float]:
    """``echo_roles`` (``tool``, ``tool=0.1,user=0.05``) as role -> alpha; a role without ``=alpha`` takes
    ``default_alpha`` (``echo_coef``). Raises ValueError in one line: an unknown or repeated role, an alpha that is not
    a finite number > 0 (prime-rl's ``alpha: Field(gt=0)``), an empty table (its ``require_a_role``)."""
    from sharpgrpo.validation import did_you_mean

    table: dict[str, float] = {}
    for entry in (part.strip() for part in str(text).split(",")):
        if not entry:
            continue
        role, sep, value = (piece.strip() for piece in entry.partition("="))
        if role not in ENVIRONMENT_ROLES:
            hint = did_you_mean(role, ENVIRONMENT_ROLES)
            raise ValueError(f"echo_roles: unknown role {role!r}{hint}; the roles are {', '.join(ENVIRONMENT_ROLES)}.")
        if role in table:
            raise ValueError(f"echo_roles: role {role!r} is given twice.")
        try:
            alpha = float(value) if sep else float(default_alpha)
        except ValueError:
            alpha = math.nan
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"echo_roles: {role}={value!r}: alpha must be a finite number > 0.")
        table[role] = alpha
    if not table:
        raise ValueError("echo_roles is empty: name at least one role (system, user, assistant, tool), e.g. `tool`.")
    return table


def role_weights(env_roles: torch.Tensor, table: dict[str, float]) -> torch.Tensor:
    """Each token's alpha from its role code (``ENVIRONMENT_ROLES`` position + 1), 0 for a role not in ``table`` and
    for code 0. (B, T) long -> (B, T) float64."""
    alphas = torch.tensor([0.0] + [table.get(role, 0.0) for role in ENVIRONMENT_ROLES], dtype=torch.float64,
                          device=env_roles.device)
    return alphas[env_roles.long().clamp(0, len(ENVIRONMENT_ROLES))]


def filter_keep(token_filter: Callable, name: str, completion_ids: torch.Tensor, lengths: list[int],
                rows: list[int]) -> torch.Tensor:
    """The keep flags ``token_filter`` gives each completion of ``rows``: called as ``token_filter(token_ids)`` with
    the row's first ``lengths[row]`` token ids (a list of ints), it returns one truthy / falsy flag per token (a list,
    tuple or 1-D tensor of that length); other rows keep everything. A wrong type or length raises ValueError in one line
    naming the filter. (B, T) -> (B, T) bool."""
    keep = torch.ones(completion_ids.shape, dtype=torch.bool)
    for row in rows:
        ids = completion_ids[row, :lengths[row]].tolist()
        flags = token_filter(ids)
        if torch.is_tensor(flags):
            flags = flags.tolist() if flags.dim() == 1 else flags
        if not isinstance(flags, (list, tuple)) or len(flags) != len(ids):
            got = f"{len(flags)} flags" if isinstance(flags, (list, tuple)) else type(flags).__name__
            raise ValueError(f"echo_filter {name} must return one keep flag per token of the completion it is given: "
                             f"got {got} for a completion of {len(ids)} tokens.")
        keep[row, :len(ids)] = torch.tensor([bool(flag) for flag in flags], dtype=torch.bool)
    return keep.to(completion_ids.device)


@register_strategy("echo")
class EchoStrategy(TokenLossStrategy):
    """``echo``: alpha (-log p) on the environment tokens (tool results, retrieved passages) of the roles in
    ``echo_roles`` (alpha per role, ``echo_coef`` by default), narrowed by ``echo_filter``, averaged over them beside
    the policy loss. Metrics: ``echo/nll`` (mean -log p over the selected environment tokens) and ``echo/env_tokens``
    (their number in the micro-batch, averaged over processes). A batch without environment tokens (no tools, no
    multi-turn rollout) is said once: echo then adds nothing."""

    params = ("echo_coef", "echo_roles", "echo_filter")
    sets: ClassVar[frozenset[str]] = frozenset({"env_loss", "env_mask"})
    importance_sampling_levels = ("token", "sequence")  # it reads no ratio
    metrics = ("echo/nll", "echo/env_tokens")
    paper = StrategyPaper(
        "ECHO: Terminal Agents Learn World Models for Free",
        "Shrivastava, Kauffmann, Awadallah, Papailiopoulos 2026, ECHO: Terminal Agents Learn World Models for Free "
        "(arXiv:2605.24517)",
        "2605.24517",
    )

    @classmethod
    def check_params(cls, args: Any) -> None:
        """``echo_roles`` parses (known roles, alphas > 0) and ``echo_filter`` imports as a callable (one line)."""
        from sharpgrpo.validation import ConfigError

        try:
            parse_role_table(args.echo_roles, args.echo_coef)
            if args.echo_filter is not None:
                load_filter(args.echo_filter)
        except ValueError as error:
            raise ConfigError(" ".join(str(error).split())) from None

    def __init__(self, args: Any):
        super().__init__(args)
        self._said_no_environment = False
        self.roles = parse_role_table(args.echo_roles, args.echo_coef)
        self.token_filter = None if args.echo_filter is None else load_filter(args.echo_filter)

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
        tool = ENVIRONMENT_ROLES.index("tool") + 1  # a rollout that names no role: TRL's tool results
        roles = context.env_roles if context.env_roles is not None else env_mask.long() * tool
        weights = role_weights(roles, self.roles).to(env_mask.dtype) * env_mask
        if self.token_filter is not None:
            if context.completion_ids is None:
                raise ValueError("echo_filter needs the completion's token ids (LossContext.completion_ids).")
            lengths = (context.mask.to(env_mask.dtype) + env_mask).clamp(max=1).sum(dim=1).long().tolist()
            rows = (weights != 0).any(dim=1).nonzero().flatten().tolist()
            weights = weights * filter_keep(self.token_filter, self.args.echo_filter, context.completion_ids, lengths,
                                            rows).to(weights.dtype)
        selected = (weights != 0).to(env_mask.dtype)
        count = selected.sum()
        nll = masked_mean(-context.logps.detach(), selected)
        terms = LossTerms(env_loss=echo_token_loss(context.logps, weights), env_mask=selected)
        return terms, {"echo/nll": nll, "echo/env_tokens": count}


def load_filter(path: str) -> Callable:
    """``echo_filter``'s callable from its import path (``package.module:function`` or ``package.module.function``,
    as every importable field; ``sharpgrpo.registry.import_from_path``). Raises ValueError in one line."""
    from sharpgrpo.registry import import_from_path

    token_filter = import_from_path(str(path))
    if not callable(token_filter):
        raise ValueError(f"echo_filter {path!r} is not callable (it must be a function of a completion's token ids).")
    return token_filter
