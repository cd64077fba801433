"""Strategy interfaces and the strategy registry.

Three kinds of strategy change the GRPO policy loss (docs/methods.md, Notation and "Strategy kinds"):

* a **token-weight** strategy returns ``w[i, t]`` used inside the per-token surrogate of every micro-batch
  (placement ``ratio`` or ``loss``); it sees only the current micro-batch and is evaluated from the detached,
  temperature-scaled probabilities of the policy being trained (GRPO-SG Eq. 19);
* an **advantage** strategy returns token advantages ``A[i, t]`` replacing TRL's broadcast ``A[i]``; it is run
  once per generation batch, before TRL shuffles and splits it, on whole groups gathered from every process;
* a **loss** strategy changes, per micro-batch and inside the loss, how each token's policy term enters it
  (``LossTerms``: a gradient mask, a trust-region mask, an extra per-token term, a per-token clip range or KL factor,
  or a sequence-level objective replacing the per-token surrogate).

Strategies are pure tensor code: no trainer, accelerate or transformers imports. Each registered class is a thin
adapter that reads its parameters from ``args`` and calls a pure function that cites its equation. The parameters
are declared once, with their defaults, in ``sharpgrpo.strategy_params.StrategyParams`` (which ``SharpGRPOConfig``
inherits); a strategy reads them as plain attributes and lists them in ``params``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
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
        correct: (B,) bool or None; whether each completion is correct (``sharpgrpo.strategies.correctness``: the reward
            functions' answer checks, else the docs/methods.md §3 fallback). Filled when a strategy sets
            ``needs_correctness``; strategies read it through ``sharpgrpo.strategies.correctness.batch_correct``.
        entropies: (B, T) float32 or None; the per-token entropy H[i, t] = -sum_v p(v) log p(v) of the sampling
            policy's temperature-scaled next-token distribution at each completion position (any value on padding).
            Filled only when a strategy sets ``needs_entropies``, from the pass that already serves the old
            log-probabilities and hidden states (``sharpgrpo.training.generation.entropy_inputs``).
        extras: name -> (B, T) tensor, the extra per-token inputs the strategies name in ``needs_inputs`` (e.g. a
            teacher's log-probabilities), each supplied at generation by a registered generation input
            (``sharpgrpo.training.generation.inputs``); empty when none is needed.
        step: the optimizer steps the trainer had completed when the batch was generated (TRL's
            ``state.global_step``): the batch first trains at step ``step + 1`` (a schedule such as RLSD's lambda).
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
    entropies: torch.Tensor | None = None
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0


def group_slices(group_ids: torch.Tensor) -> Iterator[slice]:
    """Row slices of the consecutive groups of ``group_ids`` (B,), in order (``GenerationBatch`` contract)."""
    _, counts = torch.unique_consecutive(group_ids, return_counts=True)
    start = 0
    for count in counts.tolist():
        yield slice(start, start + count)
        start += count


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (any 0/1 dtype, broadcastable), over everything or along ``dim``; 0 where the
    mask selects nothing. The one masked mean the strategies share (their metrics and statistics)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def on_policy(args: Any) -> bool:
    """Whether every update is on-policy (p_old = p, every ratio 1): ``num_iterations`` 1 and a generation batch no
    longer than one optimizer step (``steps_per_generation <= gradient_accumulation_steps``)."""
    generate_every = args.steps_per_generation * args.num_iterations
    return args.num_iterations == 1 and args.gradient_accumulation_steps % generate_every == 0


def warn_on_policy(name: str, what: str, args: Any) -> None:
    """Warn when training is on-policy (p_old = p in every update), where ``what`` (a loss strategy's term that reads
    the ratio p / p_old) does nothing."""
    if on_policy(args):
        warnings.warn(
            f"strategies: {name} with num_iterations=1 and steps_per_generation <= gradient_accumulation_steps "
            f"(on-policy: p_old = p in every update): {what}. Set num_iterations > 1 or steps_per_generation > "
            "gradient_accumulation_steps, as the released runs do (several mini-batch updates per batch).",
            UserWarning,
            stacklevel=3,
        )


def unclipped_range(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token clip range (``LossTerms.epsilon_low``, ``epsilon_high``) that removes PPO's clip:
    clamp(r, 1 - 1, 1 + inf) = r (0-d tensors on ``like``'s device)."""
    return like.new_tensor(1.0), like.new_tensor(float("inf"))


class Strategy:
    """What every strategy declares and checks, whatever its kind.

    ``check_params`` (relations among its own parameters, for every registered strategy) and ``check_config`` (the
    whole config, when the strategy is selected) are the strategy's own checks, run once while the config (a
    ``SharpGRPOConfig``) is built, before any model loads: raise ``sharpgrpo.validation.ConfigError`` with one line
    naming the field, or ``warnings.warn`` for a setting that runs but likely does not do what was meant. A single
    field's range is declared with the field (``sharpgrpo.strategy_params``), not here.
    """

    kind: ClassVar[str] = ""
    params: ClassVar[tuple[str, ...]] = ()  # config fields it reads (model card)
    paper: ClassVar[StrategyPaper | None] = None
    # The metrics it may log, by their logged names ("thr/tau"): what its ``token_advantages`` or ``loss_terms``
    # returns, and a folded strategy's ``loss_factor_metric``. Logging another is refused naming the strategy.
    metrics: ClassVar[tuple[str, ...]] = ()
    # The per-token diagnostics it may hand the telemetry, name -> what the column holds: a loss strategy's
    # ``LossTerms.columns``, an advantage strategy's ``token_columns()``. The telemetry file writes them as
    # ``<strategy>/<name>`` and describes them with this text; an undeclared one is refused naming the strategy
    # (``declared_columns``).
    columns: ClassVar[dict[str, str]] = {}

    def __init__(self, args: Any):
        self.args = args

    @classmethod
    def registered_name(cls) -> str:
        """The name the strategy is registered under (its class name when it is not registered)."""
        return next((name for name in STRATEGIES.names() if STRATEGIES.get(name) is cls), cls.__name__)

    @classmethod
    def check_params(cls, args: Any) -> None:
        """Relations among this strategy's own parameters (e.g. low <= high), checked for every registered strategy,
        selected or not, since every config carries every parameter; nothing by default."""

    @classmethod
    def check_config(cls, args: Any) -> None:
        """Cross-field checks and warnings on the whole config, run when the strategy is selected; nothing by
        default."""

    @classmethod
    def inert(cls, args: Any) -> str | None:
        """Why this strategy would do nothing with these parameters (e.g. ``ktae_scale=0: ...``), or None when it
        acts (the default). A selected strategy that is inert is refused with the reason while the config is built
        (``StrategySet.check_config``), from the command line and the Python API alike."""
        return None

    def state_dict(self) -> dict:
        """State that must survive checkpoint and resume (e.g. a random generator's state tensor): tensors, numbers,
        strings, lists and dicts only, since checkpoints are loaded with ``torch.load(weights_only=True)``."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class TokenWeightStrategy(Strategy):
    """Base class of token-weight strategies. Subclasses implement ``weights``."""

    kind: ClassVar[str] = "weight"
    params: ClassVar[tuple[str, ...]] = ("weight_placement", "kl_weighting")  # config fields it reads (model card)
    # Weights must be > 0 on completion tokens; a strategy whose weights may be exactly 0 (a Gaussian kernel far from
    # its centre underflows in float32) sets this, and is then checked for >= 0. Such a strategy must not be combined
    # with ``kl_weighting: inside`` (log w).
    zero_weights: ClassVar[bool] = False
    # The temperature of the log-probabilities the loss reads (its weights, ratio and KL, and the reference's); None:
    # the sampling temperature, as TRL computes them (softmax(logits / T)). A strategy reproducing code that scores
    # raw logits sets 1.0; the trainer then scores the policy and the reference at that temperature.
    loss_logps_temperature: ClassVar[float | None] = None

    @classmethod
    def check_config(cls, args: Any) -> None:
        """With ``weight_placement: ratio``, a warning naming the tokens it silences (:meth:`ratio_silenced`)."""
        if args.weight_placement != "ratio":
            return
        eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        which = cls.ratio_silenced(args, eps_high)
        if which is None:
            return
        warnings.warn(
            f"weight_placement='ratio' (GRPO-SG Eq. 13 as printed): on-policy (r = 1) a positive-advantage token "
            f"with w * r > 1 + epsilon_high = {1 + eps_high:g} lands in the clipped branch and gets no gradient: here "
            f"{which}. Confident tokens of correct answers are then only pushed down. `weight_placement: loss` (the "
            "default) keeps GRPO's gradient times w (docs/methods.md §1).",
            UserWarning,
            stacklevel=2,
        )

    @classmethod
    def ratio_silenced(cls, args: Any, epsilon_high: float) -> str | None:
        """With ``weight_placement: ratio``, which tokens get w > 1 + ``epsilon_high`` (and so no gradient when their
        advantage is positive), in words; None when none do."""
        return "every token whose weight exceeds 1 + epsilon_high"

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T) detached log-probabilities and mask -> (B, T) weights (any value on masked positions)."""
        raise NotImplementedError

    def loss_weights(self, logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, *,
                     entropies: torch.Tensor | None = None) -> torch.Tensor:
        """The weights the loss of a micro-batch uses: ``weights`` of the detached log-probabilities, detached. A
        strategy whose weights need the micro-batch's advantages ((B, 1) or (B, T)), its per-token entropies, or
        carry gradient, overrides this; ``logps`` are the current policy's, with their graph, ``entropies`` (B, T)
        the detached per-token entropy of the policy being trained (the tensor TRL's loss computes; None where the
        caller has none). An override without the ``entropies`` keyword still works: it is then not passed."""
        weights = self.weights(logps.detach(), mask)
        return weights.detach() if isinstance(weights, torch.Tensor) else weights  # the trainer checks the rest

    def bounds(self) -> tuple[float, float]:
        """The range the weights can take; tokens at either end are counted in ``token_weight/frac_at_*``."""
        raise NotImplementedError


class AdvantageStrategy(Strategy):
    """Base class of advantage strategies. Subclasses implement ``token_advantages``."""

    kind: ClassVar[str] = "advantage"
    needs_hidden_states: ClassVar[bool] = False  # fill GenerationBatch.hidden_states and the unembedding
    needs_old_logps: ClassVar[bool] = True  # fill GenerationBatch.old_logps (an extra forward when TRL skipped it)
    needs_correctness: ClassVar[bool] = False  # fill GenerationBatch.correct (runs the answer checks)
    needs_entropies: ClassVar[bool] = False  # fill GenerationBatch.entropies (the sampling policy's entropy)
    # Extra per-token inputs, by the name of the generation input that supplies them (GenerationBatch.extras;
    # providers: sharpgrpo.training.generation.inputs).
    needs_inputs: ClassVar[tuple[str, ...]] = ()
    # A strategy whose output is a per-token factor of the sampling probabilities alone (AR) may be applied inside the
    # loss instead, from the loss's own detached log-probabilities, when training is on-policy (they equal p_old) and
    # it is last in the list: the factor f > 0 commutes with min/clip, so the loss is exactly equal and no
    # log-probabilities are computed at generation. Such a strategy implements ``loss_factor``.
    folds_into_loss: ClassVar[bool] = False
    loss_factor_metric: ClassVar[str] = ""  # the metric the loss logs for the factor's masked mean

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Whole groups -> ((B, T) token advantages, metrics averaged over the batch)."""
        raise NotImplementedError

    def loss_factor(self, logps: torch.Tensor) -> torch.Tensor:
        """(B, T) detached on-policy log-probabilities -> (B, T) factor of the token advantages
        (``folds_into_loss`` strategies only)."""
        raise NotImplementedError

    def token_scores(self) -> torch.Tensor | None:
        """(B, T) per-token scores behind the last ``token_advantages`` call (e.g. THR's influence scores), written
        out for inspection by ``dump_token_scores``; None for strategies without such scores."""
        return None

    def token_columns(self) -> dict[str, torch.Tensor]:
        """The per-token diagnostics of the last ``token_advantages`` call, (B, T) each (the batch's rows), by name:
        every column the class declares in ``columns`` and no other (the per-token telemetry's
        ``<strategy>/<name>``, e.g. a teacher's log-probability); {} for strategies that declare none."""
        return {}


def declared_columns(strategy_name: str, strategy: Strategy, columns: dict[str, torch.Tensor],
                     reserved: tuple[str, ...] = (), complete: bool = False) -> dict[str, torch.Tensor]:
    """``columns`` detached, after checking them against the class's ``columns``: an undeclared one (or one named
    like a ``reserved`` name) is refused naming the strategy, and with ``complete`` a declared one that is missing
    too. The one check of every kind's per-token diagnostics."""
    declared = getattr(strategy, "columns", {})
    wrong = sorted(name for name in columns if name not in declared or name in reserved)
    missing = sorted(name for name in declared if name not in columns) if complete else []
    if wrong:
        named_like = " or which are named like a LossTerms field" if reserved else ""
        said = f"returned the per-token column(s) {', '.join(wrong)}, which its class does not declare in `columns`"
        raise ValueError(f"Strategy {strategy_name} {said}{named_like} (declared: "
                         f"{', '.join(sorted(declared)) or 'none'}).")
    if missing:
        raise ValueError(f"Strategy {strategy_name} did not return its declared per-token column(s) "
                         f"{', '.join(missing)} (declared: {', '.join(sorted(declared))}).")
    return {name: value.detach() for name, value in columns.items()}


@dataclass(frozen=True)
class LossContext:
    """What a loss-side strategy sees of one micro-batch inside the loss. Shapes: ``B`` completions, ``T`` tokens.

    Attributes:
        logps: (B, T) log-probabilities of the sampled tokens under the policy being trained, with their graph.
        old_logps: (B, T) detached log-probabilities under the policy in the ratio's denominator: TRL's
            ``old_per_token_logps`` (recomputed by the training engine), the loss's own detached ``logps`` on-policy.
        advantages: (B, 1) or (B, T) the advantages the loss uses (after the advantage strategies).
        mask: (B, T) {0, 1}, 1 on completion tokens that enter the loss.
        entropies: (B, T) detached per-token entropy of the policy being trained (the tensor TRL's loss computes).
        epsilon_low, epsilon_high: the configured clip range of the ratio.
        entropy_mask: (B, T) {0, 1} or None, TRL's top-entropy mask (``top_entropy_quantile`` < 1), which TRL applies
            to the per-token loss after the loss-side terms; a sequence-level objective applies it itself (GMPO).
        sampling_logps: (B, T) detached log-probabilities reported by the sampling engine (TRL's
            ``sampling_per_token_logps``: vLLM's, which may differ from ``old_logps``; NaN where it could not score a
            token), or None when the engine reports none (transformers generation): the input of rollout corrections.
        env_mask: (B, T) {0, 1} or None, 1 on the completion tokens the environment wrote (TRL's ``tool_mask`` 0: tool
            results, the search setting's retrieved passages), which ``mask`` leaves out; None when the batch has no
            tool mask. ``logps`` covers them (the forward scores every completion token).
        env_roles: (B, T) long or None, the message role of each environment token where the rollout says it
            (``ENVIRONMENT_ROLES`` codes, 1-based; 0 on the model's tokens and on scaffolding of no message: the search
            setting's passages are ``tool``, its retry message ``user``); None when the rollout gives none (TRL's
            tool calling, whose environment tokens are all tool results).
        completion_ids: (B, T) long or None, the completion's token ids (None where the caller has none).
    """

    logps: torch.Tensor
    old_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropies: torch.Tensor | None
    epsilon_low: float
    epsilon_high: float
    entropy_mask: torch.Tensor | None = None
    sampling_logps: torch.Tensor | None = None
    env_mask: torch.Tensor | None = None
    env_roles: torch.Tensor | None = None
    completion_ids: torch.Tensor | None = None


# The message roles of environment tokens, as prime-rl's ECHO names them (``EchoRolesConfig``); a token's code in
# ``LossContext.env_roles`` is its role's position here plus 1, 0 meaning none.
ENVIRONMENT_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class LossTerms:
    """What a loss-side strategy changes in the per-token loss; every field (B, T) (or broadcastable to it) or None
    (unchanged). How the fields of several strategies combine (``sharpgrpo.training.loss.terms``): masks and KL
    factors multiply, extra terms add; the clip range and a sequence objective belong to one strategy at most
    (``TokenLossStrategy.sets``), which the config checks.

    Attributes:
        gradient_mask: {0, 1}; 0 stops the gradient of the token's policy term (its value stays): Clip-Cov's
            "detach" as the paper words it.
        token_mask: a detached factor >= 0 on the token's policy term; 0 removes it from the loss (value and
            gradient; the token still counts in the loss type's normaliser): a trust-region mask (DPPO), Clip-Cov as
            released, or an importance weight (a rollout correction's, broadcast from (B, 1) for a sequence's).
        loss_mask: {0, 1}, detached; 0 removes the token from the loss *and* from the loss type's normaliser (each
            sequence's token count, the micro-batch's, the window's), as verl's rejection removes it from
            ``response_mask``: a rollout correction's rejected tokens. Every later use of the mask (TRL's off-policy
            mask, the KL and entropy terms, the metrics, each token's loss share) reads the reduced mask.
        loss_cap: a detached upper bound on the token's policy term after ``token_mask`` (``inf`` where none):
            where the term exceeds it, the term is the bound, with no gradient (verl's dual-clip PPO,
            ``clip_ratio_c``: ``min(-A c, l)`` for A < 0).
        extra_loss: a per-token term added to the policy term, with its own graph: KL-Cov's penalty.
        epsilon_low, epsilon_high: per-token clip range replacing the configured one (Archer; ``inf`` for
            ``epsilon_high`` and 1 for ``epsilon_low`` remove PPO's clip, as KL-Cov and DPPO release it).
        kl_weight: a per-token factor on the beta * KL term: Archer.
        sequence_loss: (B,) per-sequence policy loss replacing the per-token surrogate and its aggregation: the
            micro-batch's policy loss is its mean over sequences, plus beta times each sequence's token-mean KL
            (GMPO, TRL's ``trl.experimental.gmpo``).
        env_loss: a per-token term on the environment's tokens (``LossContext.env_mask``), outside the policy loss
            and its aggregation: the micro-batch adds its sum over those tokens divided by their number (and by the
            gradient accumulation steps), as prime-rl normalises its ``ce`` component by its own token count: ECHO.
        env_mask: {0, 1}, detached: the environment tokens ``env_loss`` covers and is averaged over, narrowing the
            batch's (``LossContext.env_mask``); None: all of them.
        columns: per-token diagnostics that do not enter the loss, (B, T) each, by name: the per-token telemetry's
            ``<strategy>/<name>`` columns (a rollout correction's importance weight before rejection), each
            declared with what it holds in the strategy's ``TokenLossStrategy.columns``.
    """

    # The per-token fields and what each holds: the per-token telemetry's ``<strategy>/<field>`` columns.
    TERMS: ClassVar[dict[str, str]] = {
        "gradient_mask": "1 where the strategy keeps the gradient of the token's policy term, 0 where it stops it",
        "token_mask": "the strategy's factor on the token's policy term (0 removes it: value and gradient)",
        "loss_mask": "0 where the strategy removes the token from the loss and from its normaliser, else 1",
        "loss_cap": "the strategy's upper bound on the token's policy term (inf: none)",
        "extra_loss": "the per-token term the strategy adds to the policy term",
        "epsilon_low": "the strategy's per-token low clip range epsilon_low",
        "epsilon_high": "the strategy's per-token high clip range epsilon_high",
        "kl_weight": "the strategy's factor on the token's beta * KL term",
        "env_loss": "the strategy's per-token term on an environment token (tool result, retrieved passage), averaged "
                    "over the micro-batch's environment tokens apart from the policy loss",
        "env_mask": "1 on the environment tokens the strategy's env_loss covers and is averaged over",
    }

    gradient_mask: torch.Tensor | None = None
    token_mask: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    loss_cap: torch.Tensor | None = None
    extra_loss: torch.Tensor | None = None
    epsilon_low: torch.Tensor | None = None
    epsilon_high: torch.Tensor | None = None
    kl_weight: torch.Tensor | None = None
    sequence_loss: torch.Tensor | None = None
    env_loss: torch.Tensor | None = None
    env_mask: torch.Tensor | None = None
    columns: dict[str, torch.Tensor] = field(default_factory=dict)


class TokenLossStrategy(Strategy):
    """Base class of loss-side strategies: per micro-batch, inside the loss, they change how each token's policy term
    enters it (:class:`LossTerms`: gradient masks, trust-region masks, extra per-token terms, per-token clip ranges).
    Subclasses implement ``loss_terms``; metrics are device scalars (no host synchronisation), logged as the trainer
    logs the weight metrics."""

    kind: ClassVar[str] = "loss"
    # The LossTerms fields it may set. Two selected strategies that both set an exclusive field ("clip_range",
    # "sequence_loss") are refused at config time, naming both; a strategy that sets "sequence_loss" replaces the
    # per-token surrogate, so no weight, advantage or other loss strategy composes with it.
    sets: ClassVar[frozenset[str]] = frozenset()
    # TRL loss types whose surrogate the strategy's terms are defined on; None: every one. Checked at config time.
    loss_types: ClassVar[tuple[str, ...] | None] = None
    # TRL importance-sampling levels it is defined for (its terms read the token ratio p / p_old).
    importance_sampling_levels: ClassVar[tuple[str, ...]] = ("token",)
    # ``columns`` (Strategy): the per-token diagnostics its loss_terms returns in ``LossTerms.columns``.

    @classmethod
    def check_config(cls, args: Any) -> None:
        """The configured loss type and importance-sampling level are ones the strategy is defined for."""
        from sharpgrpo.validation import ConfigError

        name = cls.registered_name()
        if cls.loss_types is not None and args.loss_type not in cls.loss_types:
            raise ConfigError(
                f"strategies: {name} is not defined with loss_type={args.loss_type} (it supports "
                f"{', '.join(cls.loss_types)}); set loss_type to one of them or drop {name}."
            )
        if args.importance_sampling_level not in cls.importance_sampling_levels:
            raise ConfigError(
                f"strategies: {name} is not defined with importance_sampling_level={args.importance_sampling_level} "
                f"(it reads the token ratio p / p_old; supported: {', '.join(cls.importance_sampling_levels)})."
            )

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        """One micro-batch -> (the terms it changes, metrics as 0-d device tensors: averaged over processes and
        logged under their names, with no host synchronisation of their own)."""
        raise NotImplementedError

    # Whether its ``loss_mask`` is known at generation from the old and the sampling log-probabilities alone
    # (``generation_loss_mask``): the window-normalised loss types' token count then drops those tokens.
    removes_tokens_at_generation: ClassVar[bool] = False

    def generation_loss_mask(self, old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor
                             ) -> torch.Tensor:
        """{0, 1} (B, T): the ``loss_mask`` its ``loss_terms`` will set for these rows, computed once per generation
        batch so that TRL's ``num_items_in_batch`` (the divisor of ``dapo``/``cispo``/``vespo``) counts only the
        tokens left in the loss, as verl's ``batch_num_tokens`` counts its ``response_mask`` after rejection."""
        raise NotImplementedError
