"""Cost of the teacher strategies: optimizer step time of ``opd`` (a teacher model's forward per generation batch)
and ``otb`` (the optimal token baseline's sum_v p(v)^2 from the fused LM head) against ``equal``, with an A/A
control.

Trainers, identical settings (``benchmarks/step_bench.py``'s ``config_kwargs``) on their own copies of the same tiny
model: ``equal`` (the baseline: sharpgrpo with the identity weight, i.e. GRPO), ``equal#2`` (identical to ``equal``:
the A/A control, the benchmark's own noise), ``opd`` with ``teacher_model`` a second tiny model folder of the same
size and tokenizer (another seed; weights do not change the cost), optionally ``opd_ref`` (``--ref``: the reference
model as teacher, which needs ``beta`` > 0, so every trainer then runs with ``--beta``; the baseline then pays the
reference forward too) and ``otb``. Their real training loops are timed in the interleaved schedule of
``step_bench.time_training_steps`` (each trainer's ``train()`` in a worker thread parked between steps, one trainer
running at a time, the order rotated every round; from ``on_step_begin`` to ``on_step_end``: generation, rewards,
the teacher's forward, the advantage strategies, loss, backward and the optimizer step).

Reported per trainer: the median step time; against ``equal``: the paired ratio (the median over rounds of the
trainer's step / ``equal``'s step in the same round) with a 95% bootstrap interval over rounds (pairs kept), and the
ratio of medians with its interval (``step_bench.summarise``). The A/A row is the error bar: an effect smaller than
its distance from 1 is not resolved. For each ``opd`` trainer also: the CPU time of its teacher's forward (the
``teacher_logps`` provider, timed around each call inside the step) against the paired difference of its step and
``equal``'s in the same round, both as medians over the timed rounds: whether the teacher's forward is the whole
extra cost.

    python benchmarks/distillation_cost.py                          # the demo tiny model, 2 + 15 rounds
    python benchmarks/distillation_cost.py --repeats 30 --ref --beta 0.04 --json distillation.json
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_bench  # sets up malloc before torch is imported

BASELINE, CONTROL = "equal", "equal#2"


def parse_args(argv=None):
    """``--ref`` (also time ``opd`` with the reference model as teacher), then every option of step_bench.py
    (defaults here: 2 warm-up and 15 timed rounds, phase ``step``, one thread)."""
    import argparse

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--ref", action="store_true", help="also time opd with teacher_model: ref (needs --beta > 0)")
    known, rest = own.parse_known_args(argv)
    args = step_bench.parse_args(["--warmup", "2", "--repeats", "15", "--phases", "step", "--threads", "1", *rest])
    args.ref = known.ref
    if args.ref and args.beta <= 0:
        raise SystemExit("--ref needs --beta > 0 (TRL loads the reference model only then), e.g. --beta 0.04")
    args.baseline = BASELINE  # step_bench.summarise compares to it
    return args


def build_teacher(args) -> Path:
    """A second tiny model of the same size and tokenizer (another seed, no warm start: the weights do not change
    the cost), cached beside step_bench's model."""
    from sharpgrpo.models.prepared import default_cache_dir
    from sharpgrpo.models.tiny import TINY_MODEL_VERSION, build_tiny_model

    directory = default_cache_dir() / (f"bench-teacher-{args.architecture}-h{args.hidden_size}-l{args.num_layers}"
                                       f"-s{args.seed + 1}-v{TINY_MODEL_VERSION}")
    return build_tiny_model(directory, architecture=args.architecture, hidden_size=args.hidden_size,
                            num_layers=args.num_layers, warm_start_steps=0, seed=args.seed + 1)


def setups(args, teacher: Path) -> dict[str, dict]:
    """Trainer name -> its strategy settings."""
    plan = {BASELINE: {"strategies": ["equal"]}}
    if args.control:
        plan[CONTROL] = {"strategies": ["equal"]}
    plan["opd"] = {"strategies": ["opd"], "teacher_model": str(teacher)}
    if args.ref:
        plan["opd_ref"] = {"strategies": ["opd"], "teacher_model": "ref"}
    plan["otb"] = {"strategies": ["otb"]}
    return plan


def build(args, model_path: Path, teacher: Path, root: Path) -> dict:
    from transformers import AutoTokenizer, PrinterCallback, ProgressCallback

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
    from sharpgrpo.data.demo import demo_dataset

    max_steps = args.warmup + args.repeats
    prompts = (max_steps + 2) * args.batch_size // args.num_generations
    dataset = demo_dataset(max(512, 4 * prompts), seed=args.seed)
    reward = step_bench.make_binary_reward(args.reward_threshold)
    trainers = {}
    for index, (name, settings) in enumerate(setups(args, teacher).items()):
        config = SharpGRPOConfig(**step_bench.config_kwargs(args, root / f"trainer{index}", max_steps), **settings)
        trainer = SharpGRPOTrainer(model=str(model_path), reward_funcs=[reward], args=config, train_dataset=dataset,
                                   processing_class=AutoTokenizer.from_pretrained(model_path))
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        if "teacher_logps" in trainer._input_providers:
            trainer.teacher_times = []
            trainer._input_providers["teacher_logps"] = timed(trainer._input_providers["teacher_logps"],
                                                              trainer.teacher_times)
        trainers[name] = trainer
    return trainers


def timed(provide, times: list):
    """``provide`` recording the process CPU time of each call in ``times`` (the clock of step_bench's steps with
    one thread)."""
    def call(output):
        start = time.process_time()
        value = provide(output)
        times.append(time.process_time() - start)
        return value

    return call


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    primary, clock, model_path = step_bench.prepare_run(args)
    teacher = build_teacher(args)
    with tempfile.TemporaryDirectory() as root:
        trainers = build(args, Path(model_path), teacher, Path(root))
        load_before = step_bench.load_average()
        times = step_bench.time_training_steps(trainers, args)
        load_after = step_bench.load_average()
        teacher_times = {name: trainer.teacher_times[args.warmup:] for name, trainer in trainers.items()
                         if hasattr(trainer, "teacher_times")}
    rows = step_bench.summarise(times, primary, args)
    print(f"model {Path(model_path).name} (teacher {teacher.name}), {args.batch_size} completions x "
          f"{args.max_completion_length} tokens per step in groups of {args.num_generations}, beta {args.beta}; "
          f"{args.repeats} timed rounds after {args.warmup} warm-up; {clock} time; load average {load_before} -> "
          f"{load_after}; {time.time() - started:.0f} s")
    print(f"| trainer | median step | paired ratio to {BASELINE} | 95% CI | ratio of medians (95% CI) |")
    print("|---|---|---|---|---|")
    for row in rows:
        if row["trainer"] == BASELINE:
            print(f"| {BASELINE} | {row['median_s'] * 1e3:.1f} ms | 1 | | |")
            continue
        label = f"{CONTROL} (A/A control)" if row["trainer"] == CONTROL else row["trainer"]
        low, high = row["paired_ci"]
        print(f"| {label} | {row['median_s'] * 1e3:.1f} ms | {row['paired']:.3f} ({(row['paired'] - 1) * 100:+.1f}%) "
              f"| {low:.3f}-{high:.3f} | {row['ratio']:.3f} ({row['ratio_ci'][0]:.3f}-{row['ratio_ci'][1]:.3f}) |")
    for name, spent in teacher_times.items():
        extra = [t[primary] - b[primary] for t, b in zip(times[name], times[BASELINE], strict=True)]
        print(f"{name}: teacher forward {statistics.median(spent) * 1e3:.1f} ms CPU per step (median of "
              f"{len(spent)}); step minus {BASELINE}'s in the same round {statistics.median(extra) * 1e3:.1f} ms "
              f"(median; A/A: {control_gap(times, primary) * 1e3:+.1f} ms)")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "times": times,
                                         "teacher_times": teacher_times, "rows": rows}, indent=1))


def control_gap(times: dict, primary: int) -> float:
    """Median over rounds of the A/A control's step minus the baseline's (0 without the control)."""
    if CONTROL not in times:
        return 0.0
    return statistics.median(c[primary] - b[primary] for c, b in zip(times[CONTROL], times[BASELINE], strict=True))


if __name__ == "__main__":
    main()
