"""What the sampling policy's per-token entropy costs the generation phase (docs/methods.md §11.1).

Paired comparison of the same advantage strategy with and without the entropy: ``ktae`` (which reads no entropy)
against ``ktae`` declaring ``needs_entropies`` (registered here as ``ktae+entropy``: identical advantages, plus the
entropy computed and gathered into its ``GenerationBatch``). Two generation paths: ``capture`` (the entropy read from
transformers' decoding steps) and ``forward`` (``generation_capture: false``, the vLLM path: one backbone forward and
the LM head chunked over the vocabulary). Each round runs one ``_generate_and_score_completions`` of every trainer on
the same prompts with the same seed (so the same completions), the order rotated per round; the table gives the
median time and the median over rounds of the paired ratio with/without, with a 95% bootstrap interval, beside an A/A
control (a second ``ktae`` trainer); with one thread (``--threads 1``, the default) the clock is the process CPU time.

Also timed (``--head``): the chunked entropy of ``entropies_from_hidden_states`` against the log-probability read
``logps_from_hidden_states`` (what the forward path already computes for ``cw_grpo``) at a real vocabulary size.

    python benchmarks/entropy_cost.py --rounds 12            # tiny model, CPU
    python benchmarks/entropy_cost.py --head --vocab 49152 --hidden 576 --rows 16 --length 256
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch


# Per generation path: the strategy without the entropy, an identical second trainer (the A/A control: how far from 1
# the benchmark reads on this machine), and the strategy with the entropy.
LABELS = ("ktae", "ktae#2", "ktae+entropy")


def bootstrap_interval(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def generation_phase(rounds: int, warmup: int, batch_size: int, length: int, clock=time.perf_counter) -> list[dict]:
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset
    from sharpgrpo.models.tiny import build_tiny_model
    from sharpgrpo.strategies import STRATEGIES, register_strategy

    if "ktae+entropy" not in STRATEGIES:
        register_strategy("ktae+entropy")(type("KTAEWithEntropy", (STRATEGIES.get("ktae"),), {"needs_entropies": True}))

    def binary_reward(prompts, completions, allowed, **kwargs):
        return [float(r >= 0.5) for r in allowed_letters_reward(prompts, completions, allowed)]

    tmp = Path(tempfile.mkdtemp())
    model_path = build_tiny_model(tmp / "tiny")
    trainers = {}
    for path in ("capture", "forward"):
        for label in LABELS:
            name = label.split("#")[0]  # ktae#2: a second, identical ktae trainer (the A/A control)
            args = SharpGRPOConfig(
                output_dir=str(tmp / f"{path}-{label}"), report_to=[], use_cpu=True, bf16=False, strategies=[name],
                per_device_train_batch_size=batch_size, num_generations=8, max_completion_length=length,
                generation_capture=path == "capture", seed=0,
                generation_kwargs={"min_new_tokens": length},
            )
            trainer = SharpGRPOTrainer(model=str(model_path), reward_funcs=[binary_reward], args=args,
                                       train_dataset=demo_dataset(batch_size),
                                       processing_class=AutoTokenizer.from_pretrained(model_path))
            trainer.model.train()
            trainers[path, label] = trainer
    prompts = [demo_dataset(batch_size)[i // 8] for i in range(batch_size)]
    times = {key: [] for key in trainers}
    keys = list(trainers)
    for r in range(warmup + rounds):
        order = keys[r % len(keys):] + keys[: r % len(keys)]
        for key in order:
            torch.manual_seed(r)
            start = clock()
            trainers[key]._generate_and_score_completions(prompts)
            if r >= warmup:
                times[key].append(clock() - start)
    rows = []
    for path in ("capture", "forward"):
        base = times[path, "ktae"]
        for label in LABELS[1:]:
            other = times[path, label]
            ratios = [b / a for a, b in zip(base, other, strict=True)]
            low, high = bootstrap_interval(ratios)
            rows.append({"path": path, "trainer": label, "without_s": statistics.median(base),
                         "with_s": statistics.median(other), "ratio": statistics.median(ratios), "low": low,
                         "high": high})
    return rows


def head_cost(vocab: int, hidden: int, rows: int, length: int, repeats: int) -> dict:
    from sharpgrpo.training.generation.entropy_inputs import entropies_from_hidden_states
    from sharpgrpo.training.generation.capture import logps_from_hidden_states

    g = torch.Generator().manual_seed(0)
    states = torch.randn(rows, length, hidden, generator=g)
    weight = torch.randn(vocab, hidden, generator=g) / hidden**0.5
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    timings = {"logps": [], "entropy": []}
    for _ in range(repeats):
        for name, fn in (("logps", lambda: logps_from_hidden_states(states, ids, weight, None, 1.0, 8)),
                         ("entropy", lambda: entropies_from_hidden_states(states, weight, None, 1.0, 8))):
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in timings.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--head", action="store_true", help="time the LM-head reads instead")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--head_length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads; with 1 (the default) the clock is the process CPU time, which a "
                        "shared machine disturbs much less than the wall time")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    if args.head:
        result = head_cost(args.vocab, args.hidden, args.rows, args.head_length, args.repeats)
        print(f"V={args.vocab} H={args.hidden} B={args.rows} T={args.head_length}: log-probabilities "
              f"{result['logps']:.3f} s, entropy (chunked) {result['entropy']:.3f} s")
        return
    clock_name = "process CPU" if clock is time.process_time else "wall"
    print(f"generate + score, {clock_name} time, {args.rounds} rounds after {args.warmup} warm-up rounds")
    print("| path | trainer | ktae (median s) | this trainer (median s) | paired ratio to ktae | 95% interval |")
    print("|---|---|---|---|---|---|")
    for row in generation_phase(args.rounds, args.warmup, args.batch_size, args.length, clock):
        label = f"{row['trainer']} (A/A control)" if "#" in row["trainer"] else row["trainer"]
        print(f"| {row['path']} | {label} | {row['without_s']:.3f} | {row['with_s']:.3f} | {row['ratio']:.3f} | "
              f"{row['low']:.3f}-{row['high']:.3f} |")


if __name__ == "__main__":
    main()
