"""Cost of per-token telemetry (``token_telemetry``): optimizer step time with telemetry every N steps against off.

Two ``SharpGRPOTrainer`` with identical settings on their own copies of the same model, one with
``token_telemetry: false``, one with ``token_telemetry: true, telemetry_steps: N`` (a third, ``off#2``, identical to
``off``, is the A/A control;
``--no_control`` leaves it out). Their real training loops are timed in the interleaved schedule of
``benchmarks/step_bench.py`` (phase ``step``: each trainer's ``train()`` in a worker thread, parked between steps,
one trainer running at a time, the order rotated every round; from ``on_step_begin`` to ``on_step_end``, which
includes the telemetry file's gathering and writing: its callback runs before the timer's). A step of ``on`` that
is a telemetry step captures the loss tensors and writes one parquet file.

Reported: the mean step time of each trainer (telemetry's cost is paid once every N steps, so the mean, not the
median, is the right statistic), the ratio of means with a 95% bootstrap interval over blocks of N consecutive rounds
(each block holds one telemetry step; pairs kept), the mean extra time of a telemetry step over the same round's
``off`` step, the file size per telemetry step, and the largest array the recorder held (its chunks are per token:
nothing of size B x T x V is kept).

    python benchmarks/telemetry_bench.py                       # the tiny demo model of step_bench.py
    python benchmarks/telemetry_bench.py --model_dir PATH --batch_size 16 --max_completion_length 12 \\
        --reward_threshold 0.25 --repeats 30                   # e.g. sharpgrpo-smol, prepared beforehand
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_bench  # sets up malloc before torch is imported


def parse_args(argv=None):
    """``--telemetry_steps`` (10) and ``--strategy`` (grpo_sg), then every option of step_bench.py (defaults here:
    2 warm-up and 30 timed steps, phase ``step``, one thread)."""
    import argparse

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--telemetry_steps", type=int, default=10)
    own.add_argument("--strategy", default="grpo_sg")
    known, rest = own.parse_known_args(argv)
    args = step_bench.parse_args(["--warmup", "2", "--repeats", "30", "--phases", "step", "--threads", "1", *rest])
    args.telemetry_steps, args.strategy = known.telemetry_steps, known.strategy
    return args


def build(args, model_path: Path, root: Path) -> dict:
    from transformers import AutoTokenizer, PrinterCallback, ProgressCallback

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
    from sharpgrpo.data.demo import demo_dataset

    max_steps = args.warmup + args.repeats
    prompts = (max_steps + 2) * args.batch_size // args.num_generations
    dataset = demo_dataset(max(512, 4 * prompts), seed=args.seed)
    reward = step_bench.make_binary_reward(args.reward_threshold)
    trainers = {}
    setups = (("off", False), ("on", True), *((("off#2", False),) if args.control else ()))
    for index, (name, telemetry) in enumerate(setups):
        kwargs = step_bench.config_kwargs(args, root / f"trainer{index}", max_steps)
        config = SharpGRPOConfig(**kwargs, strategies=[args.strategy], token_telemetry=telemetry,
                                 telemetry_steps=args.telemetry_steps if telemetry else 0)
        trainer = SharpGRPOTrainer(model=str(model_path), reward_funcs=[reward], args=config, train_dataset=dataset,
                                   processing_class=AutoTokenizer.from_pretrained(model_path))
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainers[name] = trainer
    recorder = trainers["on"]._telemetry
    recorder.largest_array = 0
    capture = recorder.capture

    def measured_capture(step, inputs, result):  # the largest array the recorder keeps
        capture(step, inputs, result)
        for chunk in recorder.chunks:
            recorder.largest_array = max(recorder.largest_array, max(a.size for a in chunk.values()))

    recorder.capture = measured_capture
    return trainers


def mean_ratio_interval(on, off, block: int, resamples: int, rng) -> tuple[float, float]:
    blocks = [list(range(start, min(start + block, len(on)))) for start in range(0, len(on), block)]
    values = []
    for _ in range(resamples):
        picked = [i for _ in blocks for i in blocks[rng.randrange(len(blocks))]]
        values.append(sum(on[i] for i in picked) / sum(off[i] for i in picked))
    values.sort()
    return values[int(0.025 * resamples)], values[min(resamples - 1, int(0.975 * resamples))]


def main(argv=None):
    args = parse_args(argv)
    primary, clock, model_path = step_bench.prepare_run(args)
    started = time.time()
    with tempfile.TemporaryDirectory() as root:
        trainers = build(args, Path(model_path), Path(root))
        times = step_bench.time_training_steps(trainers, args)
        folder = Path(root) / "trainer1" / "telemetry"
        files = sorted(folder.glob("telemetry_*.parquet"))
        sizes = [f.stat().st_size for f in files]
        import pyarrow.parquet as pq

        rows = [pq.read_metadata(f).num_rows for f in files]
        largest = trainers["on"]._telemetry.largest_array
        vocab = trainers["on"].model.config.vocab_size
    steps = list(range(args.warmup + 1, args.warmup + args.repeats + 1))
    series = {name: [t[primary] for t in values] for name, values in times.items()}
    rng = random.Random(args.seed)
    print(f"model {model_path}, strategy {args.strategy}, {args.batch_size} completions x {args.max_completion_length}"
          f" tokens per step, telemetry every {args.telemetry_steps} steps; {args.repeats} timed steps after "
          f"{args.warmup} warm-up; {clock} time; load average {step_bench.load_average()}; "
          f"{time.time() - started:.0f} s")
    print("| trainer | mean step | ratio of means to off | 95% CI (blocks of N rounds) |")
    print("|---|---|---|---|")
    off = series["off"]
    for name in series:
        mean = statistics.fmean(series[name])
        if name == "off":
            print(f"| off | {mean * 1e3:.1f} ms | 1 | |")
            continue
        low, high = mean_ratio_interval(series[name], off, args.telemetry_steps, args.bootstrap, rng)
        ratio = mean / statistics.fmean(off)
        print(f"| {name} | {mean * 1e3:.1f} ms | {ratio:.4f} ({(ratio - 1) * 100:+.2f}%) | {low:.4f}-{high:.4f} |")
    due = [i for i, s in enumerate(steps) if s % args.telemetry_steps == 0]
    other = [i for i in range(len(steps)) if i not in due]
    extra = [series["on"][i] - off[i] for i in due]
    baseline_gap = statistics.fmean(series["on"][i] - off[i] for i in other) if other else 0.0
    print(f"telemetry steps {[steps[i] for i in due]}: on - off in the same round {[f'{e * 1e3:.1f}' for e in extra]}"
          f" ms (other steps: {baseline_gap * 1e3:+.1f} ms on average)")
    print(f"files: {len(files)}, {statistics.fmean(sizes) / 1024:.1f} KiB per step on average "
          f"({statistics.fmean(rows):.0f} token rows, {statistics.fmean(sizes) / max(statistics.fmean(rows), 1):.1f}"
          f" bytes per token); largest array the recorder held: {largest} elements (B x T x V would be "
          f"{args.batch_size * args.max_completion_length * vocab})")
    if args.json is not None:
        args.json.write_text(json.dumps({"times": times, "sizes": sizes, "rows": rows, "steps": steps}))


if __name__ == "__main__":
    main()
