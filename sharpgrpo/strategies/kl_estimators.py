"""Per-token estimators of KL(pi_theta || pi_ref) from the sampled tokens (``kl_estimator``; docs/methods.md §15.3).

With d = log pi_ref(y_t) - log pi_theta(y_t) for a token y_t sampled from pi_theta (Schulman 2020, "Approximating
KL divergence", http://joschu.net/blog/kl-approx.html):

* ``k1``: -d = log pi_theta - log pi_ref (unbiased, high variance, can be negative);
* ``k2``: d^2 / 2 (biased; its gradient is the gradient of KL's second-order expansion);
* ``k3``: exp(d) - d - 1 (unbiased, >= 0, low variance): TRL 1.16's estimator (``GRPOTrainer._compute_loss``,
  ``trl/trainer/grpo_trainer.py`` L3100-3102), and so the default; no clamping;
* ``low_var_kl``: verl's ``"low_var_kl"`` (= its ``"k3"``): k3 of d clamped to [-20, 20], the result clamped to
  [-10, 10] (verl-project/verl@1dda039 ``verl/trainer/ppo/core_algos.py`` ``kl_penalty_forward`` L2215-2253). Equal
  to ``k3`` wherever |d| <= 20 and k3 <= 10;
* ``k3_plus``: verl's ``"k3+"`` (``kl_penalty`` L2187-2212): the value of ``low_var_kl`` with the gradient of ``k2``
  (a straight-through estimator: k2 - sg[k2] + sg[low_var_kl]), since the expected gradient of k1 and k3 is not the
  gradient of KL while k2's is (verl's note, after Schulman 2020).

Pure tensor code, no trainer imports; the loss calls :func:`kl_estimate` for its beta * KL term.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3", "k3_plus", "low_var_kl")
DEFAULT_KL_ESTIMATOR = "k3"  # TRL's


def kl_estimate(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = DEFAULT_KL_ESTIMATOR) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate of the sampled tokens by ``estimator`` (one of ``KL_ESTIMATORS``).
    logps (B, T) the policy's log-probabilities, with their graph; ref_logps (B, T) the reference's -> (B, T)."""
    return kl_from_log_ratio(ref_logps - logps, estimator)


def kl_from_log_ratio(log_ratio: torch.Tensor, estimator: str = DEFAULT_KL_ESTIMATOR) -> torch.Tensor:
    """The same from d = log pi_ref - log pi_theta (B, T), with its graph: every estimator is a function of d alone
    (the loss shifts d by log w for ``kl_weighting: inside``)."""
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1
    if estimator == "low_var_kl":
        clamped = torch.clamp(log_ratio, min=-20, max=20)
        return torch.clamp(torch.exp(clamped) - clamped - 1, min=-10, max=10)
    if estimator == "k3_plus":
        value = kl_from_log_ratio(log_ratio, "low_var_kl")
        gradient = kl_from_log_ratio(log_ratio, "k2")
        return gradient - gradient.detach() + value.detach()
    raise ValueError(f"kl_estimator={estimator!r}: must be one of {', '.join(KL_ESTIMATORS)}.")
