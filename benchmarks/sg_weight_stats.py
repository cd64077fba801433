"""GRPO-SG weight statistics and the distribution of sampled-token probabilities on a run's saved completions.

For each temperature, every completion token's probability p under the model (logits / temperature, as the trainer
scores them) and its GRPO-SG weight under the given ``sg_*`` values: quantiles of p, the share of tokens at the
weight's lower and upper clip, the mean weight, and the p above which the weight is clipped to its upper bound.

    python benchmarks/sg_weight_stats.py --model sharpgrpo-smol --completions outputs/run/completions \
        --temperatures 0.7 1.0 [--set sg_tau=0.5 ...]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from sharpgrpo.diagnostics.tokens import completion_logps, completion_weights, read_logged_completions, weight_strategy
from sharpgrpo.evaluation.models import load_model_and_tokenizer


def saturation_probability(alpha: float, mu: float, tau: float, upper: float) -> float:
    """The p at which alpha (sigmoid(p / tau) - mu) reaches ``upper`` (inf when it never does on [0, 1])."""
    target = upper / alpha + mu
    if not 0.0 < target < 1.0:
        return math.inf
    return tau * math.log(target / (1.0 - target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--completions", required=True, help="A run's completions folder (save_completions: true).")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--max_rows", type=int, default=None)
    args = parser.parse_args()
    overrides = {k: json.loads(v) for k, _, v in (item.partition("=") for item in args.overrides)}
    prompts, completions = read_logged_completions(args.completions, args.max_rows)
    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu")
    strategy, config, _ = weight_strategy("grpo_sg", **overrides)
    lower, upper = strategy.bounds()
    p_star = saturation_probability(config.sg_alpha, config.sg_mu, config.sg_tau, upper)
    print(f"{len(completions)} completions; sg_alpha {config.sg_alpha}, sg_mu {config.sg_mu}, "
          f"sg_tau {config.sg_tau:.4g}, bounds [{lower}, {upper}]; w reaches the upper bound at p >= {p_star:.3f}")
    print("| temperature | tokens | p q10 | p q25 | p median | p q75 | p q90 | at lower | at upper | mean w |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for temperature in args.temperatures:
        pairs = completion_logps(model, tokenizer, prompts, completions, temperature)
        weights = torch.cat(completion_weights(pairs, strategy)).double()
        p = torch.cat([logps for _, logps in pairs]).double().exp()
        q = torch.quantile(p, torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64)).tolist()
        at_lower = (weights <= lower + 1e-6).double().mean().item()
        at_upper = (weights >= upper - 1e-6).double().mean().item()
        print(f"| {temperature} | {p.numel()} | " + " | ".join(f"{x:.3f}" for x in q)
              + f" | {at_lower:.1%} | {at_upper:.1%} | {weights.mean().item():.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
