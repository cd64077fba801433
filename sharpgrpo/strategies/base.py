"""Strategy interfaces and the strategy registry.

Two kinds of strategy change the GRPO policy loss (docs/methods.md, Notation):

* a **token-weight** strategy returns ``w[i, t]`` used inside the per-token surrogate of every micro-batch
  (placement ``ratio`` or ``loss``); it sees only the current micro-batch and is evaluated from the detached,
  temperature-scaled probabilities of the policy being trained (GRPO-SG Eq. 19);
* an **advantage** strategy returns token advantages ``A[i, t]`` replacing TRL's broadcast ``A[i]``; it is run
  once per generation batch, before TRL shuffles and splits it, on whole groups gathered from every process.

Strategies are pure tensor code: no trainer, accelerate or transformers imports. Each registered class is a thin
adapter that reads its parameters from ``args`` and calls a pure function that cites its equation. The parameters
are declared once, with their defaults, in ``sharpgrpo.strategy_params.StrategyParams`` (which ``SharpGRPOConfig``
inherits); a strategy reads them as plain attributes and lists them in ``params``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from sharpgrpo.registry import Registry

STRATEGIES: Registry[type] = Registry("strategy")
register_strategy = STRATEGIES.register


class StrategyPaper(NamedTuple):
    """The paper a strategy implements, for the model card (TRL's ``_paper`` convention) and its BibTeX entry."""

    title: str
    citation: str
    id: str | None = None  # arXiv id, where known


@dataclass(frozen=True)
class GenerationBatch:
    """Whole groups of one generation batch, as seen by advantage strategies.

    Rows are completions, ordered so that the ``num_generations`` completions of a group are consecutive
    (``group_ids`` is non-decreasing) and every group is complete, even when the groups were split across
    processes for generation. Shapes: ``B`` completions, ``T`` the longest completion (right padded).

    Attributes:
        old_logps: (B, T) float, detached temperature-scaled log-probabilities of the sampled tokens under the
            policy that sampled them; None when no configured strategy sets ``needs_old_logps``.
        completion_mask: (B, T) {0, 1}, 1 on completion tokens that enter the loss.
        completion_ids: (B, T) long, the sampled tokens.
        advantages: (B, T) float, the token advantages so far (TRL's group-normalised ``A[i]`` broadcast over
            ``t``, or the output of an earlier advantage strategy in the configured list).
        rewards: (B,) float, the total (weighted) reward of each completion.
        group_ids: (B,) long, the group (prompt) each completion belongs to.
        num_generations: completions per group, ``G``.
        hidden_states: (B, T, H) float or None; last-layer hidden states at the positions predicting each
            completion token (the input of the unembedding). Filled only for strategies that set
            ``needs_hidden_states``.
        unembedding_weight: (V, H) or None; the LM head weight, with ``unembedding_bias`` (V,) or None.
        temperature: the sampling temperature that scales the logits.
        correct: (B,) bool or None; whether each completion is correct (``sharpgrpo.correctness``: the reward
            functions' answer checks, else the docs/methods.md §3 fallback). Filled when a strategy sets
            ``needs_correctness``; strategies read it through ``sharpgrpo.correctness.batch_correct``.
    """

    old_logps: torch.Tensor | None
    completion_mask: torch.Tensor
    completion_ids: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    num_generations: int
    hidden_states: torch.Tensor | None = None
    unembedding_weight: torch.Tensor | None = None
    unembedding_bias: torch.Tensor | None = None
    temperature: float = 1.0
    correct: torch.Tensor | None = None


class TokenWeightStrategy:
    """Base class of token-weight strategies. Subclasses implement ``weights``."""

    kind: ClassVar[str] = "weight"
    params: ClassVar[tuple[str, ...]] = ("weight_placement", "kl_weighting")  # config fields it reads (model card)
    paper: ClassVar[StrategyPaper | None] = None
    # Weights must be > 0 on completion tokens; a strategy whose weights may be exactly 0 (a Gaussian kernel far from
    # its centre underflows in float32) sets this, and is then checked for >= 0. Such a strategy must not be combined
    # with ``kl_weighting: inside`` (log w).
    zero_weights: ClassVar[bool] = False

    def __init__(self, args: Any):
        self.args = args

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T) detached log-probabilities and mask -> (B, T) weights (any value on masked positions)."""
        raise NotImplementedError

    def loss_weights(self, logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        """The weights the loss of a micro-batch uses: ``weights`` of the detached log-probabilities, detached. A
        strategy whose weights need the micro-batch's advantages ((B, 1) or (B, T)), or carry gradient, overrides
        this; ``logps`` are the current policy's, with their graph."""
        weights = self.weights(logps.detach(), mask)
        return weights.detach() if isinstance(weights, torch.Tensor) else weights  # the trainer checks the rest

    def bounds(self) -> tuple[float, float]:
        """The range the weights can take; tokens at either end are counted in ``token_weight/frac_at_*``."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """State that must survive checkpoint and resume (e.g. a random generator's state tensor): tensors, numbers,
        strings, lists and dicts only, since checkpoints are loaded with ``torch.load(weights_only=True)``."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class AdvantageStrategy:
    """Base class of advantage strategies. Subclasses implement ``token_advantages``."""

    kind: ClassVar[str] = "advantage"
    params: ClassVar[tuple[str, ...]] = ()  # config fields it reads (model card)
    paper: ClassVar[StrategyPaper | None] = None
    needs_hidden_states: ClassVar[bool] = False  # fill GenerationBatch.hidden_states and the unembedding
    needs_old_logps: ClassVar[bool] = True  # fill GenerationBatch.old_logps (an extra forward when TRL skipped it)
    needs_correctness: ClassVar[bool] = False  # fill GenerationBatch.correct (runs the answer checks)
    # A strategy whose output is a per-token factor of the sampling probabilities alone (AR) may be applied inside the
    # loss instead, from the loss's own detached log-probabilities, when training is on-policy (they equal p_old) and
    # it is last in the list: the factor f > 0 commutes with min/clip, so the loss is exactly equal and no
    # log-probabilities are computed at generation. Such a strategy implements ``loss_factor``.
    folds_into_loss: ClassVar[bool] = False
    loss_factor_metric: ClassVar[str] = ""  # the metric the loss logs for the factor's masked mean

    def __init__(self, args: Any):
        self.args = args

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Whole groups -> ((B, T) token advantages, metrics averaged over the batch)."""
        raise NotImplementedError

    def loss_factor(self, logps: torch.Tensor) -> torch.Tensor:
        """(B, T) detached on-policy log-probabilities -> (B, T) factor of the token advantages
        (``folds_into_loss`` strategies only)."""
        raise NotImplementedError

    def token_scores(self) -> torch.Tensor | None:
        """(B, T) per-token scores behind the last ``token_advantages`` call (e.g. THR's influence scores), written
        out for inspection by ``thr_debug_dump``; None for strategies without such scores."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
