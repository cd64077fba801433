"""THR retention with the default threshold (docs/methods.md §3) on a real model's hidden states.

For each completion length L: sample groups of G completions of exactly L tokens from the model (temperature 1, no
early stop) for demo prompts, take the last-layer hidden states and the LM head, split each group into P = the first
G/2 samples (the samples are exchangeable, so this is a uniformly random split) and the rest, and report the
fraction of the group's tokens with |THR| > tau (``thr/frac_retained``), the fraction of groups with tau < 0, and the
coefficient of variation of (1 - p) and of w(p) (1 - p) over the sampled tokens (GRPO-SG Theorem 3.5's mechanism).
THR's paper reports 18% retained for Qwen2.5-Math-1.5B and 14% for 7B (Table 16).

    OMP_NUM_THREADS=1 python benchmarks/thr_retention.py --lengths 64 128 256 512 --groups 4
    OMP_NUM_THREADS=1 python benchmarks/thr_retention.py --model sharpgrpo-smol --addition --lengths 32 64 128 \
        --groups 3 --betas 1 2 4

``--addition``: the real-model demo's prompts (single-digit sums as one user message, rendered with the model's chat
template) instead of the tiny model's letter prompts. ``--betas``: one retained fraction per threshold scale
``thr_beta`` on the same samples and scores.
"""

from __future__ import annotations

import argparse

import torch

from sharpgrpo.diagnostics.thr_retention import sample_group
from sharpgrpo.strategies.thr import thr_threshold, thr_token_advantages, token_hidden_reward_scores


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharpgrpo.data.demo import demo_prompt
    from sharpgrpo.models.prepared import resolve_model_name
    from sharpgrpo.strategies.probability_shaping import probability_shaping_weights

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sharpgrpo-tiny")
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256, 512])
    parser.add_argument("--groups", type=int, default=4, help="groups (prompts) per length")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--betas", nargs="+", type=float, default=[1.0], help="threshold scales (thr_beta)")
    parser.add_argument("--addition", action="store_true", help="the real-model demo's chat prompts")
    args = parser.parse_args()
    path = resolve_model_name(args.model)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if args.addition:
        from sharpgrpo.data.addition import addition_question

        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": addition_question(a, b)}],
                                                 tokenize=False, add_generation_prompt=True)
                   for a, b in ((3, 4), (8, 7), (5, 9), (2, 6), (9, 9), (1, 0))]
    else:
        prompts = [demo_prompt(letters) for letters in ("abc", "deh", "bfg", "ceh", "adg", "bcf")]
    betas = " | ".join(f"retained, beta {b:g} (mean [min, max])" for b in args.betas)
    print(f"| L | groups | {betas} | groups with tau < 0 (beta 1) | CV(1-p) | CV(w(1-p)) |")
    print("|---|---|" + "---|" * len(args.betas) + "---|---|---|")
    for length in args.lengths:
        fractions, negative, all_probs = {b: [] for b in args.betas}, 0, []
        for group in range(args.groups):
            hidden, ids, probs = sample_group(model, tokenizer, prompts[group % len(prompts)], length,
                                              args.group_size, seed=group)
            mask = torch.ones_like(ids)
            positive = torch.arange(args.group_size) < args.group_size // 2
            head = model.get_output_embeddings()
            scores = token_hidden_reward_scores(hidden, ids, mask, positive, head.weight,
                                                getattr(head, "bias", None)).scores
            advantages = torch.where(positive, 1.0, -1.0)
            for beta in args.betas:
                tau = thr_threshold(scores, mask, positive, beta)
                _, metrics = thr_token_advantages(scores, tau, advantages, mask, positive)
                fractions[beta].append(metrics["thr/frac_retained"])
                negative += beta == 1.0 and tau < 0
            all_probs.append(probs.flatten().double())
        p = torch.cat(all_probs)
        w = probability_shaping_weights(p, 2.0, 0.25, 1 / 9, 1.0, 1.4)
        cv_plain = float((1 - p).std() / (1 - p).mean())
        cv_shaped = float((w * (1 - p)).std() / (w * (1 - p)).mean())
        cells = " | ".join(f"{sum(f) / len(f):.3f} [{min(f):.3f}, {max(f):.3f}]" for f in fractions.values())
        print(f"| {length} | {args.groups} | {cells} | {negative} | {cv_plain:.3f} | {cv_shaped:.3f} |", flush=True)


if __name__ == "__main__":
    main()
