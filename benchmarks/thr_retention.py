"""THR retention with the default threshold (docs/methods.md §3) on a real model's hidden states.

For each completion length L: sample groups of G completions of exactly L tokens from the model (temperature 1, no
early stop) for demo prompts, take the last-layer hidden states and the LM head, split each group into P = the first
G/2 samples (the samples are exchangeable, so this is a uniformly random split) and the rest, and report the
fraction of the group's tokens with |THR| > tau (``thr/frac_retained``), the fraction of groups with tau < 0, and the
coefficient of variation of (1 - p) and of w(p) (1 - p) over the sampled tokens (GRPO-SG Theorem 3.5's mechanism).
THR's paper reports 18% retained for Qwen2.5-Math-1.5B and 14% for 7B (Table 16).

    OMP_NUM_THREADS=1 python benchmarks/thr_retention.py --lengths 64 128 256 512 --groups 4
"""

from __future__ import annotations

import argparse

import torch

from sharpgrpo.diagnostics.thr_retention import thr_retention


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharpgrpo.demo import demo_prompt
    from sharpgrpo.strategies.probability_shaping import probability_shaping_weights
    from sharpgrpo.prepared_models import resolve_model_name

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sharpgrpo-tiny")
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256, 512])
    parser.add_argument("--groups", type=int, default=4, help="groups (prompts) per length")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    path = resolve_model_name(args.model)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [demo_prompt(letters) for letters in ("abc", "deh", "bfg", "ceh", "adg", "bcf")]
    print("| L | groups | frac retained (mean) | min | max | groups with tau < 0 | CV(1-p) | CV(w(1-p)) |")
    print("|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        fractions, negative, all_probs = [], 0, []
        for group in range(args.groups):
            fraction, tau, probs = thr_retention(model, tokenizer, prompts[group % len(prompts)], length,
                                             args.group_size, seed=group)
            fractions.append(fraction)
            negative += tau < 0
            all_probs.append(probs.flatten().double())
        p = torch.cat(all_probs)
        w = probability_shaping_weights(p, 2.0, 0.25, 1 / 9, 1.0, 1.4)
        cv_plain = float((1 - p).std() / (1 - p).mean())
        cv_shaped = float((w * (1 - p)).std() / (w * (1 - p)).mean())
        print(f"| {length} | {args.groups} | {sum(fractions) / len(fractions):.3f} | {min(fractions):.3f} | "
              f"{max(fractions):.3f} | {negative} | {cv_plain:.3f} | {cv_shaped:.3f} |")


if __name__ == "__main__":
    main()
