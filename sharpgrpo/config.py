"""``SharpGRPOConfig``: TRL's ``GRPOConfig`` plus the token-level strategies and their parameters.

Every parameter that resolves an ambiguity of the papers says so in its help string (see METHODS.md). The config
validates itself in ``__post_init__``, before any model is loaded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from sharpgrpo.losses import LOSS_TYPES, RATIO_PLACEMENT_LOSS_TYPES
from sharpgrpo.strategies.covariance import CW_ADVANTAGE_MEANS, CW_SCOPES, CW_VARIANTS, released_variant_conflict
from sharpgrpo.strategies.thr import VOCAB_MODES as THR_VOCABS
from sharpgrpo.validation import (
    ConfigError,
    between,
    integer,
    non_negative,
    number,
    one_of,
    parse_strategy_names,
    positive,
    validate_fields,
    validate_trl_fields,
)

WEIGHT_PLACEMENTS = ("ratio", "loss")
KL_WEIGHTINGS = ("loss", "inside", "none")
SUPPORTED_LOSS_TYPES = LOSS_TYPES  # all of TRL 1.16's
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")

# What each field of ours accepts (sharpgrpo.validation); a new field's check is one line here. Relations between
# fields (sg_lower <= sg_upper, ...) are checked in `SharpGRPOConfig._validate`. TRL's fields: TRL_FIELD_RULES.
FIELD_RULES = {
    "weight_placement": one_of(*WEIGHT_PLACEMENTS),
    "kl_weighting": one_of(*KL_WEIGHTINGS),
    "loss_type": one_of(*SUPPORTED_LOSS_TYPES),
    "importance_sampling_level": one_of(*IMPORTANCE_SAMPLING_LEVELS),
    "sg_alpha": positive(),
    "sg_mu": number(),
    "sg_tau": positive(),
    "sg_lower": positive(note="weights scale ratios"),
    "sg_upper": positive(),
    "random_weight_low": positive(),
    "random_weight_high": positive(),
    "random_weight_seed": integer(0, allow_none=True),
    "ar_alpha": between(0, 1),
    "cw_scope": one_of(*CW_SCOPES),
    "cw_advantage_mean": one_of(*CW_ADVANTAGE_MEANS),
    "cw_sigma_eps": non_negative(),
    "cw_variant": one_of(*CW_VARIANTS),
    "cw_weight_gradient": one_of(False, True, allow_none=True),
    "thr_p": between(-1, 1),
    "thr_beta": non_negative(),
    "thr_entropy_quantile": between(0, 1, high_open=True),
    "thr_vocab": one_of(*THR_VOCABS),
    "thr_keep_below_threshold": one_of(False, True),
    "thr_debug_dump": one_of(False, True),
    "nthr_length_normalized": one_of(False, True),
    "thr_chunk_size": integer(1),
    "passk_k": integer(1),
    "sharpness_probe_steps": integer(0),
    "sharpness_rho": positive(),
    "generation_capture": one_of(False, True),
}


@dataclass
class SharpGRPOConfig(GRPOConfig):
    r"""Configuration for [`SharpGRPOTrainer`]: all of [`trl.GRPOConfig`] plus the fields below.

    Strategies are chosen by name (``strategies``) and combine: token-weight strategies multiply, advantage
    strategies apply in list order. Parameters are flat so that YAML and the CLI set them directly.
    """

    strategies: list[str] | str = field(
        default_factory=lambda: ["grpo_sg"],
        metadata={
            "help": "Token-level strategies, by registered name or dotted import path; one name, a list, or a "
            "comma-separated string. Weight strategies: `grpo_sg` (GRPO-SG Eq. 19), `equal` (w = 1, plain GRPO), "
            "`random` (TR-GRPO Table 4), `reverse` (TR-GRPO Table 4). Advantage strategies: `ar` (AR-Lopti), "
            "`cw_grpo`, `thr`, `nthr`, `passk_mixed`. At most one weight strategy."
        },
    )
    # GRPO-SG / TR-GRPO probability shaping (METHODS §1).
    sg_alpha: float = field(
        default=2.0, metadata={"help": "alpha in GRPO-SG Eq. 19 / TR-GRPO Eq. 12: scale of the sigmoid shaping."}
    )
    sg_mu: float = field(default=0.25, metadata={"help": "mu in GRPO-SG Eq. 19: offset subtracted from the sigmoid."})
    sg_tau: float = field(
        default=1 / 9,
        metadata={
            "help": "tau in GRPO-SG Eq. 19 (w = clip(alpha*(sigmoid(p/tau) - mu), L, U)). Decision (METHODS §1): "
            "the papers print tau = 9, which makes w = 1 for every p in [0, 1] (plain GRPO); their appendix range "
            "(0.5, 1.5) and tau sweep (Table 7) match sigmoid(9p), so the default is 1/9. A tau whose weights are "
            "constant over p in [0, 1] triggers a warning."
        },
    )
    sg_lower: float = field(default=1.0, metadata={"help": "L in GRPO-SG Eq. 19: lower clip of the weight."})
    sg_upper: float = field(default=1.4, metadata={"help": "U in GRPO-SG Eq. 19: upper clip of the weight."})
    weight_placement: str = field(
        default="loss",
        metadata={
            "help": "Where a token weight w enters the surrogate (METHODS §1, revised). `loss` (default; TR-GRPO: "
            "\"preserves the GRPO gradient structure up to the multiplicative factor w\", GRPO-SG Theorem 3.5's "
            "g = gamma * w * grad log pi): w * min(r*A, clip(r, 1-eps_low, 1+eps_high)*A). `ratio` (GRPO-SG Eq. 13 "
            "as printed, kept as an ablation): min(w*r*A, clip(w*r, 1-eps_low, 1+eps_high)*A); on-policy every "
            "token with w > 1+eps_high and A > 0 is clipped and gets no gradient (with the sg_* defaults every "
            "positive-advantage token with p > 0.211 at the papers' epsilon_high 0.24, p > 0.193 at TRL's default "
            "0.2), so choosing it warns with that probability; logged as "
            "token_weight/frac_grad_clipped. Refused with `loss_type: vespo`, whose gamma weight acts on a whole "
            "sequence's ratio (no per-token ratio to scale)."
        },
    )
    kl_weighting: str = field(
        default="loss",
        metadata={
            "help": "How a token weight enters the k3 KL term (beta > 0). `loss` (default; the gradient of GRPO-SG "
            "Lemma 3.4 carries beta*w): w*kl. `inside` (TR-GRPO Eq. 11): w*pref/p - log(w*pref/p) - 1. `none`: kl."
        },
    )
    random_weight_low: float = field(
        default=0.5, metadata={"help": "`random` strategy: lower end of Uniform[low, high] (TR-GRPO Table 4)."}
    )
    random_weight_high: float = field(
        default=1.5, metadata={"help": "`random` strategy: upper end of Uniform[low, high] (TR-GRPO Table 4)."}
    )
    random_weight_seed: int | None = field(
        default=None,
        metadata={
            "help": "`random` strategy: generator seed (plus the process index, so ranks differ); None uses the "
            "training `seed`."
        },
    )
    ar_alpha: float = field(
        default=0.3,
        metadata={
            "help": "`ar` strategy (AR-Lopti, Yang et al. 2025): A[i,t] = (alpha*sg[p_old] + 1 - alpha) * A[i] on "
            "both advantage signs, no normalisation."
        },
    )
    # CW-GRPO (METHODS §2).
    cw_scope: str = field(
        default="group",
        metadata={
            "help": "`cw_grpo`: scope of the covariance statistics, `group` (default; the G completions of one "
            "prompt) or `batch` (the whole generation batch, all processes)."
        },
    )
    cw_advantage_mean: str = field(
        default="response",
        metadata={
            "help": "`cw_grpo`: how mean(A) in c = (logp - mean(logp)) (A - mean(A)) is taken (METHODS §2, revised; "
            "the paper: \"computed over responses\"). `response` (default): each response counted once (0 for "
            "group-normalised A). `token`: masked token mean, i.e. weighted by completion length (the earlier "
            "default; makes a group's weights depend on how long its wrong answers are)."
        },
    )
    cw_sigma_eps: float = field(
        default=1e-8, metadata={"help": "`cw_grpo`: if the scope's std of c is below this, w = 1 (METHODS §2)."}
    )
    cw_variant: str = field(
        default="paper",
        metadata={
            "help": "`cw_grpo`: `paper` (default): the paper's §2.3 as read above (group statistics from the sampling "
            "policy, once per generation batch, weights on the advantage). `released`: the authors' released code "
            "(github WangCheng0116/CW-GRPO, compute_loss): per-micro-batch weights inside the loss from the current "
            "policy's log-probabilities, logp centred per response, A centred over the micro-batch, sigma = "
            "population std + 1e-8, renormalised by B x T including padding, w on the policy term only; needs "
            "loss_type grpo, num_iterations 1, steps_per_generation 1, weight_placement loss, kl_weighting none "
            "(others are refused); cw_scope, cw_advantage_mean and cw_sigma_eps do not apply to it."
        },
    )
    cw_weight_gradient: bool | None = field(
        default=None,
        metadata={
            "help": "`cw_grpo`: let gradient flow through the weights (as the released code does). None (default): "
            "the variant's own, true for `released`, false for `paper` (true is refused there: its weights come "
            "from the sampling policy at generation)."
        },
    )
    # THR (METHODS §3).
    thr_p: float = field(
        default=0.1,
        metadata={
            "help": "`thr`: p in THR Eq. 5, A = 1[|THR| > tau] (1 + sign(THR) p) A; p > 0 favours exploitation "
            "(greedy accuracy), p < 0 exploration (pass@k)."
        },
    )
    thr_beta: float = field(
        default=1.0,
        metadata={
            "help": "`thr`/`nthr`: beta scaling the threshold tau. `thr` (METHODS §3, revised; THR App. E.5): tau = "
            "beta * min over correct responses of the mean THR score of the response's tokens, on THR's own scale "
            "(logged: thr/tau, thr/frac_groups_tau_negative). `nthr`: Deng et al. 2025 Eq. 8, unnormalised."
        },
    )
    thr_keep_below_threshold: bool = field(
        default=False,
        metadata={
            "help": "`thr`: tokens with |THR| <= tau get advantage 0 (False, the paper's setting) or keep A (True)."
        },
    )
    thr_entropy_quantile: float = field(
        default=0.0,
        metadata={
            "help": "`thr`: re-add the top-q-entropy tokens below threshold with unchanged advantage (0 = off; the "
            "paper uses 0.2 for 0.5B and Llama models)."
        },
    )
    thr_vocab: str = field(
        default="full",
        metadata={
            "help": "`thr`: `full` (exact) or `sampled` (distributions restricted to the group's tokens, not "
            "renormalised, NTHR App. 7.4)."
        },
    )
    thr_chunk_size: int = field(
        default=1024,
        metadata={"help": "`thr`: tokens per chunk of the score computation; bounds its peak extra memory."},
    )
    thr_debug_dump: bool = field(
        default=False,
        metadata={
            "help": "`thr`: write per-token scores with decoded tokens to `output_dir/thr_scores/` every "
            "generation (to see which tokens dominate, as in the paper's word clouds)."
        },
    )
    generation_capture: bool = field(
        default=True,
        metadata={
            "help": "Read the sampling log-probabilities (`cw_grpo`, `ar`) and last hidden states (`thr`, `nthr`) "
            "from transformers' `generate` instead of a second forward over the generation batch (issue 13; equal "
            "up to KV-cache rounding). On-policy `ar` (last advantage strategy) is always applied in the loss from "
            "its own log-probabilities. With vLLM the log-probabilities it returns are used when TRL computes none; "
            "THR then runs one backbone forward that also serves the log-probabilities. False: always forward."
        },
    )
    nthr_length_normalized: bool = field(
        default=False,
        metadata={
            "help": "`nthr`: keep THR's 1/|y_i| factor in the score compared with tau (False puts the score on the "
            "threshold's scale, which METHODS §3 writes without 1/|y_i|)."
        },
    )
    passk_k: int = field(default=4, metadata={"help": "`passk_mixed`: K of the pass@K advantage (Chen et al. 2025)."})

    # Diagnostics.
    sharpness_probe_steps: int = field(
        default=0,
        metadata={
            "help": "Every N optimizer steps, measure sharpness on the current batch: the loss increase after an "
            "ascent step of radius `sharpness_rho` along the normalised gradient (SAM's inner maximisation); "
            "logs sharpness/*. 0 turns the probe off."
        },
    )
    sharpness_rho: float = field(default=0.05, metadata={"help": "Radius of the sharpness probe's ascent step."})

    def __post_init__(self):
        # Every value first: TRL's own __post_init__ divides by some of them (num_generations, batch sizes).
        self.strategies = parse_strategy_names(self.strategies)
        validate_trl_fields(self)
        validate_fields(self, FIELD_RULES)
        super().__post_init__()
        self._validate()

    def _validate(self) -> None:
        from sharpgrpo.strategies import STRATEGIES

        try:
            strategy_classes = [STRATEGIES.get(name) for name in self.strategies]
        except ValueError as error:  # an unknown name or a dotted path that does not import
            raise ConfigError(f"strategies={self.strategies}: {error}") from None
        kinds = [getattr(cls, "kind", None) for cls in strategy_classes]
        for name, kind in zip(self.strategies, kinds, strict=True):
            if kind not in ("weight", "advantage"):
                raise ValueError(f"Strategy {name!r} has kind {kind!r}; expected 'weight' or 'advantage'.")
        if kinds.count("weight") > 1:
            raise ValueError(f"At most one token-weight strategy may be active; got {self.strategies}.")
        if self.sg_lower > self.sg_upper:
            raise ConfigError(f"sg_lower={self.sg_lower}: must not exceed sg_upper={self.sg_upper} (L <= U, Eq. 19).")
        if self.random_weight_low > self.random_weight_high:
            raise ConfigError(
                f"random_weight_low={self.random_weight_low}: must not exceed random_weight_high="
                f"{self.random_weight_high}."
            )
        if "passk_mixed" in self.strategies and not 1 <= self.passk_k <= self.num_generations:
            raise ConfigError(
                f"passk_k={self.passk_k}: must be an integer in [1, num_generations={self.num_generations}]."
            )
        if "cw_grpo" in self.strategies:
            self._validate_cw_variant()
        ratio_placed = self.weight_placement == "ratio" and "weight" in kinds
        if ratio_placed and self.loss_type not in RATIO_PLACEMENT_LOSS_TYPES:
            raise ConfigError(
                f"weight_placement=ratio: not defined for loss_type={self.loss_type} (its surrogate weights whole "
                "sequences by the sequence's importance ratio, with no per-token ratio for the token weight to "
                "scale); set weight_placement: loss or another loss_type."
            )
        if "grpo_sg" in self.strategies or "reverse" in self.strategies:
            self._warn_if_flat_weights()
        if self.weight_placement == "ratio" and "weight" in kinds:
            self._warn_ratio_placement()

    def _validate_cw_variant(self) -> None:
        """`cw_variant: released` only where the configuration computes the released loss (one line naming the
        setting that does); `cw_weight_gradient: true` only with it."""
        if self.cw_variant == "released":
            conflict = released_variant_conflict(self)
            if conflict:
                raise ConfigError(conflict)
        elif self.cw_weight_gradient:
            raise ConfigError(
                "cw_weight_gradient=True: needs cw_variant: released (the paper variant's weights come from the "
                "sampling policy at generation, without gradient)."
            )

    def _warn_ratio_placement(self) -> None:
        """`weight_placement: ratio` silences positive-advantage tokens with w > 1 + epsilon_high on-policy; say
        which (computed from the configured weights and epsilon_high, METHODS §1)."""
        from sharpgrpo.strategies.probability_shaping import (
            probability_shaping_weights,
            ratio_silenced_range,
            reverse_probability_shaping_weights,
        )

        eps_high = self.epsilon_high if self.epsilon_high is not None else self.epsilon
        params = (self.sg_alpha, self.sg_mu, self.sg_tau, self.sg_lower, self.sg_upper)
        if "grpo_sg" in self.strategies or "reverse" in self.strategies:
            reverse = "reverse" in self.strategies
            shaping = reverse_probability_shaping_weights if reverse else probability_shaping_weights
            found = ratio_silenced_range(lambda p: shaping(p, *params), eps_high)
            if found is None:
                return  # w never exceeds 1 + epsilon_high: nothing is silenced
            if found == (0.0, 1.0):
                which = "every token probability p in [0, 1]"
            elif found[1] == 1.0:
                which = f"every token probability p > {found[0]:.3f}"
            else:
                which = f"every token probability p < {found[1]:.3f}"
        elif "random" in self.strategies:
            low, high = self.random_weight_low, self.random_weight_high
            span = max(high - low, 1e-12)
            fraction = min(max((high - (1 + eps_high)) / span, 0.0), 1.0)
            if fraction == 0.0:
                return
            which = f"a random {fraction:.1%} of tokens (w ~ U[{low}, {high}] > 1 + epsilon_high)"
        elif "equal" in self.strategies:
            return  # w = 1
        else:
            which = "every token whose weight exceeds 1 + epsilon_high"
        warnings.warn(
            f"weight_placement='ratio' (GRPO-SG Eq. 13 as printed): on-policy (r = 1) a positive-advantage token "
            f"with w * r > 1 + epsilon_high = {1 + eps_high:g} lands in the clipped branch and gets no gradient: here "
            f"{which}. Confident tokens of correct answers are then only pushed down. `weight_placement: loss` (the "
            "default) keeps GRPO's gradient times w (METHODS §1).",
            UserWarning,
            stacklevel=3,
        )

    def _warn_if_flat_weights(self) -> None:
        import torch

        from sharpgrpo.strategies.probability_shaping import probability_shaping_weights

        grid = torch.linspace(0.0, 1.0, 1001, dtype=torch.float64)
        weights = probability_shaping_weights(grid, self.sg_alpha, self.sg_mu, self.sg_tau, self.sg_lower, self.sg_upper)
        low, high = weights.min().item(), weights.max().item()
        if high - low < 1e-6:
            warnings.warn(
                f"GRPO-SG weights are constant ({low:.4f}..{high:.4f}) for every token probability in [0, 1] with "
                f"sg_alpha={self.sg_alpha}, sg_mu={self.sg_mu}, sg_tau={self.sg_tau}, clip [{self.sg_lower}, "
                f"{self.sg_upper}]: this is plain GRPO. The papers print tau = 9, which does this; METHODS §1 uses "
                "tau = 1/9 (the default).",
                UserWarning,
                stacklevel=3,
            )
