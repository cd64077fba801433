"""``SharpGRPOConfig``: TRL's ``GRPOConfig`` plus the token-level strategies and their parameters.

Every parameter that resolves an ambiguity of the papers says so in its help string (see METHODS.md). The config
validates itself in ``__post_init__``, before any model is loaded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from sharpgrpo.strategies.covariance import CW_SCOPES
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
SUPPORTED_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
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
    "cw_sigma_eps": non_negative(),
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
        default="ratio",
        metadata={
            "help": "Where a token weight w enters the surrogate. `ratio` (default; GRPO-SG Eq. 13 and Lemma 3.4 as "
            "printed): min(w*r*A, clip(w*r, 1-eps_low, 1+eps_high)*A); note that on-policy a token with "
            "w > 1+eps_high and A > 0 is clipped and gets no gradient (logged as token_weight/frac_grad_clipped). "
            "`loss`: w * min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)."
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
    cw_sigma_eps: float = field(
        default=1e-8, metadata={"help": "`cw_grpo`: if the scope's std of c is below this, w = 1 (METHODS §2)."}
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
        default=1.0, metadata={"help": "`thr`/`nthr`: beta scaling the threshold tau (Deng et al. 2025 Eq. 8)."}
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
        if self.entropy_coef != 0.0 or getattr(self, "use_adaptive_entropy", False):
            raise ValueError(
                "SharpGRPOTrainer does not implement TRL's entropy bonus (`entropy_coef`, `use_adaptive_entropy`); "
                "set entropy_coef=0 and use_adaptive_entropy=False."
            )
        if "grpo_sg" in self.strategies or "reverse" in self.strategies:
            self._warn_if_flat_weights()

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
