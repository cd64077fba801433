"""Training step time of ``SharpGRPOTrainer`` (one trainer per strategy) against plain ``trl.GRPOTrainer``.

Every trainer is built once, with identical settings (``GRPOConfig`` for plain TRL, ``SharpGRPOConfig`` with one
strategy for ours), on its own copy of the same tiny model (``sharpgrpo.models.tiny.build_tiny_model``, sized by
``--hidden_size``/``--num_layers`` so that model compute, not Python overhead, dominates a step). Three things are
timed, always in an interleaved schedule (round r runs every trainer once, the order rotated by r so that every
trainer takes every position equally often), so that drifts of the machine load hit all trainers alike; the first
``--warmup`` rounds of each phase are discarded:

1. ``gen``: one ``_generate_and_score_completions`` call (generation, rewards, TRL's advantages, and ours: the
   group tags and the advantage strategies), on the same prompts with the same seed in every trainer of a round,
   and while no trainer has been trained yet, so all trainers of a round generate the very same completions;
2. ``loss``: forward + backward of ``compute_loss`` (TRL's ``_compute_loss`` for plain TRL, ours for the
   strategies) on a fixed batch: each trainer's own output of one seeded ``gen`` call (identical completions, each
   with its strategy's advantages), gradients cleared between calls, no optimizer step;
3. ``step``: the full optimizer step of the real training loop. Each trainer runs its own ``trainer.train()``
   (``max_steps = warmup + repeats``) in a worker thread. A ``TrainerCallback`` parks the thread at every
   ``on_step_begin`` until the scheduler (main thread) releases it, and the time from ``on_step_begin`` to
   ``on_step_end`` is recorded: it covers generation, scoring, advantages, loss, backward, gradient clipping and
   the optimizer step, exactly as in training (logging and the dataloader fetch fall between steps and are not
   timed). The scheduler releases one trainer at a time and waits until it is parked again (or finished) before
   releasing the next, so no two trainers ever run at once. This keeps TRL's loop untouched (no re-implementation
   of the Trainer's inner loop, and no repeated ``train()`` calls with their per-call setup and fresh optimizer
   state), at the cost of one idle thread per trainer.

Why three: the full step mixes generation (token by token), scoring, the loss and the optimizer, and a small
overhead in one part drowns in the others and in the noise; ``loss`` isolates the part the token-weight strategies
change, ``gen`` the part the advantage strategies change.

Workload: the demo task's prompts, a binary reward (1 if at least ``--reward_threshold`` of the first letters are
allowed; binary so that ``passk_mixed`` applies; with the defaults about a fifth of the completions score 1 and about
three quarters of the groups have mixed rewards, the groups THR and pass@k work on), and, by default, completions of exactly ``--max_completion_length`` tokens
(``min_new_tokens``; EOS is suppressed until then) so that every trainer does the same work in every step whatever
its policy has learnt. The generation batch is ``--batch_size`` completions in groups of ``--num_generations``.
Defaults: a Qwen2 of hidden size 256 with 4 layers (3.3M parameters, a vocabulary of 264 byte-level tokens), 32
completions of 16 tokens after prompts of 20, G = 8, loss ``dapo``, beta 0, one iteration per generation
(on-policy: TRL skips the old log-probabilities), fp32. On one CPU thread a step then takes about 0.9 s, of which
about 0.25 s generation and scoring and 0.4 s loss forward + backward, and the whole run 5 to 8 minutes (plus about
2 minutes to build the model the first time; it is kept in ``$SHARPGRPO_CACHE``, one folder per size).

Clocks: on CPU with one intra-op thread (``--threads 1``, the default) the primary clock is the process CPU time,
which equals the wall time on an idle machine and is much less disturbed by other processes on a shared machine;
otherwise (CUDA, or several threads) it is the wall time (CUDA synchronised at both ends). Both clocks are
recorded; the table shows the primary one and the wall-clock ratio.

Allocation: on glibc the script first sets one malloc arena for all threads and a fixed mmap threshold (see
:func:`uniform_malloc`); otherwise the worker threads' own arenas made the page-fault time differ persistently
between identical trainers.

Statistics per trainer and phase: the median time over the timed rounds; the "paired ratio" to plain TRL, the
median over rounds of ours / TRL in the same round (this cancels load drifts slower than a round), with a 95%
bootstrap interval (rounds resampled with replacement); the verdict "<= 1%?" is "yes" when the whole interval is
at most 1.01, "no" when it is entirely above, "unclear" otherwise. Also shown: the ratio of the medians (with its
paired bootstrap interval), the ratio of the minima and the ratio of the wall-time medians. A second, identical
plain ``GRPOTrainer`` (``trl#2``, the A/A control; ``--no_control`` leaves it out) is timed like the others: its
ratio shows how far from 1 the benchmark itself reads on the machine of the run. On a shared virtual machine single
timings of identical work can scatter by +-20%, so an interval of +-1% needs far more rounds than the defaults:
the defaults resolve overheads of a few percent.

Examples (from the repository root):
    python benchmarks/step_bench.py                                     # CPU, 5 to 8 minutes
    python benchmarks/step_bench.py --strategies equal grpo_sg --repeats 40
    python benchmarks/step_bench.py --model_dir ~/.cache/sharpgrpo/smollm2-135m-instruct-v1 --baseline equal \
        --strategies equal grpo_sg cw_grpo thr nthr ar passk_mixed --phases gen loss   # the real model, vs equal
    python benchmarks/step_bench.py --device cuda --dtype bfloat16 --hidden_size 512 --num_layers 8 \\
        --batch_size 64 --max_completion_length 128 --threads 0     # the warm start runs once, on the CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def uniform_malloc() -> bool:
    """glibc only, before torch starts any thread: one malloc arena for all threads, a fixed mmap threshold and no
    trimming, so that every trainer's thread allocates alike and freed tensors are reused without page faults.

    Without it each worker thread gets its own arena, and the system time of page faults (up to ~5% of a CPU step)
    differs from trainer to trainer, persistently: the A/A control read +4% to +6% on the full step."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(
            libc.mallopt(option, value) == 1
            for option, value in ((-8, 1), (-3, 32 << 20), (-1, 1 << 30))  # M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_
        )
    except (OSError, AttributeError):
        return False


UNIFORM_MALLOC = uniform_malloc()

import torch  # after uniform_malloc()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ALL_STRATEGIES = ["equal", "grpo_sg", "random", "reverse", "ar", "cw_grpo", "thr", "passk_mixed"]
PLAIN = "trl"  # the name of the plain GRPOTrainer in the tables
CONTROL = "trl#2"  # a second plain GRPOTrainer: its "overhead" is the benchmark's own noise (an A/A control)
PHASES = ("gen", "loss", "step")
TARGET = 1.01  # the target: at most 1% over plain TRL


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="+", default=ALL_STRATEGIES,
                        help="one SharpGRPOTrainer per strategy (each alone), compared with plain GRPOTrainer")
    model = parser.add_argument_group("model (sharpgrpo.models.tiny.build_tiny_model; about 3.3M parameters by default)")
    model.add_argument("--architecture", default="qwen2", choices=["qwen2", "llama"])
    model.add_argument("--hidden_size", type=int, default=256)
    model.add_argument("--num_layers", type=int, default=4)
    model.add_argument("--warm_start_steps", type=int, default=300,
                       help="supervised warm start of the tiny model (so that rewards are mixed within groups)")
    model.add_argument("--model_dir", type=Path, default=None,
                       help="where the model is built or reused (default: a folder per size in $SHARPGRPO_CACHE)")
    train = parser.add_argument_group("training settings (identical for every trainer)")
    train.add_argument("--batch_size", type=int, default=32, help="per_device_train_batch_size (completions)")
    train.add_argument("--num_generations", type=int, default=8)
    train.add_argument("--max_completion_length", type=int, default=16)
    train.add_argument("--no_fixed_length", dest="fixed_length", action="store_false",
                       help="let completions stop at EOS (default: exactly max_completion_length tokens)")
    train.add_argument("--reward_threshold", type=float, default=0.625,
                       help="binary reward: 1 if this fraction of the first letters is allowed")
    train.add_argument("--loss_type", default="dapo", choices=["dapo", "grpo", "bnpo", "dr_grpo"])
    train.add_argument("--beta", type=float, default=0.0, help="KL coefficient (> 0 adds the reference model)")
    train.add_argument("--num_iterations", type=int, default=1)
    train.add_argument("--learning_rate", type=float, default=1e-4)
    machine = parser.add_argument_group("machine")
    machine.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    machine.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                         help="bfloat16: bf16 mixed precision (GRPOConfig bf16=True, fp32 master weights)")
    machine.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave torch's default)")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    timing.add_argument("--warmup", type=int, default=2, help="discarded rounds per phase")
    timing.add_argument("--repeats", type=int, default=15, help="timed rounds of the full step")
    timing.add_argument("--micro_repeats", type=int, default=30, help="timed rounds of the gen and loss phases")
    timing.add_argument("--clock", default="auto", choices=["auto", "cpu", "wall"],
                        help="primary clock (auto: process CPU time on CPU with one thread, else wall)")
    timing.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of the ratio interval")
    timing.add_argument("--no_control", dest="control", action="store_false",
                        help=f"leave out the A/A control (a second plain GRPOTrainer, {CONTROL!r})")
    timing.add_argument("--baseline", default=PLAIN,
                        help=f"the trainer every ratio is paired against: {PLAIN!r} (plain GRPOTrainer, the default) "
                        "or one of --strategies, e.g. equal; then no plain GRPOTrainer (and no A/A control) is built, "
                        "which saves one model, its gradients and optimizer state per trainer left out. With --report: "
                        "re-pair the saved times against this trainer (plain TRL and the A/A control stay in the "
                        "table)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write every raw time to this JSON file")
    parser.add_argument("--report", type=Path, default=None, help="only re-print the tables of a --json file")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------------
# Setup
# ----------------------------------------------------------------------------------------------------------------
def prepare_run(args) -> tuple[int, str, Path]:
    """What the paired benchmarks that import this one (``telemetry_bench``, ``distillation_cost``) set up first:
    warnings off, ``--threads``, the clock (CPU time of this process when one thread runs on the CPU and ``--clock``
    is ``cpu`` or ``auto``, else wall time) and the model folder (``--model_dir`` or the built tiny model).
    Returns (the index of the primary clock in :func:`clocks`, its name, the model folder)."""
    warnings.filterwarnings("ignore")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    primary = 1 if args.clock in ("cpu", "auto") and args.device == "cpu" and args.threads == 1 else 0
    model_path = Path(args.model_dir) if args.model_dir is not None else build_model(args)
    return primary, "CPU" if primary else "wall", model_path


def build_model(args) -> Path:
    from sharpgrpo.models.prepared import default_cache_dir
    from sharpgrpo.models.tiny import TINY_MODEL_VERSION, build_tiny_model

    directory = args.model_dir or default_cache_dir() / (
        f"bench-{args.architecture}-h{args.hidden_size}-l{args.num_layers}-w{args.warm_start_steps}"
        f"-v{TINY_MODEL_VERSION}"
    )
    return build_tiny_model(directory, architecture=args.architecture, hidden_size=args.hidden_size,
                            num_layers=args.num_layers, warm_start_steps=args.warm_start_steps, seed=args.seed)


def make_binary_reward(threshold: float):
    from sharpgrpo.data.demo import allowed_letters_reward

    def binary_allowed_letters(prompts, completions, allowed, **kwargs):
        scores = allowed_letters_reward(prompts, completions, allowed)
        return [1.0 if score >= threshold else 0.0 for score in scores]

    return binary_allowed_letters


def config_kwargs(args, output_dir: Path, max_steps: int) -> dict:
    generation_kwargs = {"min_new_tokens": args.max_completion_length} if args.fixed_length else None
    return {
        "output_dir": str(output_dir),
        "report_to": [],
        "use_cpu": args.device == "cpu",
        "bf16": args.dtype == "bfloat16",
        "per_device_train_batch_size": args.batch_size,
        "gradient_accumulation_steps": 1,
        "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length,
        "generation_kwargs": generation_kwargs,
        "num_iterations": args.num_iterations,
        "loss_type": args.loss_type,
        "beta": args.beta,
        "learning_rate": args.learning_rate,
        "temperature": 1.0,
        "max_steps": max_steps,
        "logging_steps": 10**9,  # logging falls outside the timed window; keep stdout quiet
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": args.seed,
        "dataloader_num_workers": 0,
    }


def build_trainers(args, model_path: Path, output_root: Path) -> dict:
    from transformers import AutoTokenizer, PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
    from sharpgrpo.data.demo import demo_dataset

    max_steps = args.warmup + args.repeats
    prompts_needed = (max_steps * args.num_iterations + 2) * args.batch_size // args.num_generations
    dataset = demo_dataset(max(512, 4 * prompts_needed), seed=args.seed)
    reward = make_binary_reward(args.reward_threshold)
    trainers = {}
    plain = [PLAIN, *([CONTROL] if args.control else [])] if args.baseline == PLAIN else []
    names = [*plain, *args.strategies]
    for index, name in enumerate(names):
        kwargs = config_kwargs(args, output_root / f"trainer{index}", max_steps)
        if name in (PLAIN, CONTROL):
            trainer_cls, config = GRPOTrainer, GRPOConfig(**kwargs)
        else:
            trainer_cls, config = SharpGRPOTrainer, SharpGRPOConfig(**kwargs, strategies=[name])
        trainer = trainer_cls(
            model=str(model_path),
            reward_funcs=[reward],
            args=config,
            train_dataset=dataset,
            processing_class=AutoTokenizer.from_pretrained(model_path),
        )
        trainer.remove_callback(PrinterCallback)  # train()'s final log line is not needed here
        trainer.remove_callback(ProgressCallback)
        trainers[name] = trainer
    return trainers


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def rotated(names: list[str], offset: int) -> list[str]:
    offset %= len(names)
    return names[offset:] + names[:offset]


# ----------------------------------------------------------------------------------------------------------------
# Phases
# ----------------------------------------------------------------------------------------------------------------
def generation_rows(trainer, args, round_index: int) -> list[dict]:
    """One generation batch as TRL's RepeatSampler yields it: each prompt repeated num_generations times."""
    dataset = trainer.train_dataset
    groups = args.batch_size // args.num_generations
    rows = []
    for group in range(groups):
        row = dataset[(round_index * groups + group) % len(dataset)]
        rows.extend(dict(row) for _ in range(args.num_generations))
    return rows


def time_generation_and_loss(trainers: dict, args) -> tuple[dict, dict, dict]:
    """Phases ``gen`` and ``loss``; returns raw times {phase: {name: [(wall, cpu), ...]}} and a summary of the
    fixed batch. Runs before any training, so every trainer still holds the same weights."""
    names = list(trainers)
    times = {"gen": {n: [] for n in names}, "loss": {n: [] for n in names}}
    for trainer in trainers.values():
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1

    def generate(name, round_index):
        trainer = trainers[name]
        rows = generation_rows(trainer, args, round_index)
        torch.manual_seed(args.seed + round_index)
        synchronize(args.device)
        start = clocks()
        output = trainer._generate_and_score_completions(rows)
        synchronize(args.device)
        end = clocks()
        return output, (end[0] - start[0], end[1] - start[1])

    fixed = {}
    for name in names:  # the fixed batch of the loss phase (and a check that generation is identical)
        fixed[name], _ = generate(name, 10**6)
    reference = fixed[args.baseline]["completion_ids"]
    identical = all(torch.equal(out["completion_ids"], reference) for out in fixed.values())
    logged = trainers[args.baseline]._metrics["train"]["reward"]
    rewards = logged[-1] if logged else None
    summary = {"completion_shape": list(reference.shape), "identical_completions": identical, "mean_reward": rewards}

    if "gen" in args.phases:
        for round_index in range(args.warmup + args.micro_repeats):
            gc.collect()
            for name in rotated(names, round_index):
                _, elapsed = generate(name, round_index)
                if round_index >= args.warmup:
                    times["gen"][name].append(elapsed)

    if "loss" in args.phases:
        for round_index in range(args.warmup + args.micro_repeats):
            gc.collect()
            for name in rotated(names, round_index):
                trainer = trainers[name]
                trainer.model.zero_grad(set_to_none=True)
                synchronize(args.device)
                start = clocks()
                loss = trainer.compute_loss(trainer.model, fixed[name])
                trainer.accelerator.backward(loss)
                synchronize(args.device)
                end = clocks()
                if round_index >= args.warmup:
                    times["loss"][name].append((end[0] - start[0], end[1] - start[1]))
        for trainer in trainers.values():
            trainer.model.zero_grad(set_to_none=True)
    for trainer in trainers.values():  # forget the metrics of these calls (they would be logged by train())
        for mode in trainer._metrics.values():
            mode.clear()
    return times["gen"], times["loss"], summary


class StepGate:
    """TrainerCallback that parks its trainer's thread between optimizer steps and times each step."""

    def __init__(self, device: str):
        from transformers import TrainerCallback

        gate = self
        self.device = device
        self.go = threading.Semaphore(0)
        self.parked = threading.Semaphore(0)  # released when parked at a step boundary, or when train() ended
        self.times: list[tuple[float, float]] = []
        self.error: BaseException | None = None
        self.finished = False
        self._start = (0.0, 0.0)

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                gate.parked.release()
                gate.go.acquire()
                synchronize(gate.device)
                gate._start = clocks()

            def on_step_end(self, args, state, control, **kwargs):
                synchronize(gate.device)
                end = clocks()
                gate.times.append((end[0] - gate._start[0], end[1] - gate._start[1]))

        self.callback = _Callback()

    def run(self, trainer) -> None:
        try:
            trainer.train()
        except BaseException as error:  # noqa: BLE001  reported by the scheduler
            self.error = error
        finally:
            self.finished = True
            self.parked.release()


def time_training_steps(trainers: dict, args) -> dict:
    """Phase ``step``: interleaved optimizer steps of the real training loops (see the module docstring)."""
    names = list(trainers)
    gates, threads = {}, {}
    for name in names:  # start one at a time: train()'s setup never overlaps another trainer
        gate = StepGate(args.device)
        trainers[name].add_callback(gate.callback)
        thread = threading.Thread(target=gate.run, args=(trainers[name],), name=f"train-{name}", daemon=True)
        gates[name], threads[name] = gate, thread
        thread.start()
        gate.parked.acquire()
        if gate.error is not None:
            raise RuntimeError(f"trainer {name!r} failed before its first step") from gate.error
    for round_index in range(args.warmup + args.repeats):
        gc.collect()
        for name in rotated(names, round_index):
            gate = gates[name]
            gate.go.release()
            gate.parked.acquire()  # the step, the logging after it and the next batch fetch are done
            if gate.error is not None:
                raise RuntimeError(f"trainer {name!r} failed in round {round_index}") from gate.error
    for name in names:
        threads[name].join()
        if not gates[name].finished or len(gates[name].times) != args.warmup + args.repeats:
            raise RuntimeError(f"trainer {name!r} ran {len(gates[name].times)} steps")
    return {name: gates[name].times[args.warmup:] for name in names}


# ----------------------------------------------------------------------------------------------------------------
# Statistics and report
# ----------------------------------------------------------------------------------------------------------------
def bootstrap_interval(statistic, n: int, resamples: int, rng: random.Random) -> tuple[float, float]:
    """95% percentile interval of ``statistic(index)`` over rounds resampled with replacement."""
    values = sorted(statistic([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return values[int(0.025 * resamples)], values[min(resamples - 1, int(0.975 * resamples))]


def verdict(low: float, high: float) -> str:
    if high <= TARGET:
        return "yes"
    if low > TARGET:
        return "**no**"
    return "unclear"


def summarise(phase_times: dict, primary: int, args) -> list[dict]:
    """Per trainer: median and min time; against the baseline (``--baseline``, plain TRL by default): the ratio of
    medians, the paired ratio (median over rounds of ours / the baseline's in the same round, which cancels load
    drifts slower than a round), each with a 95% bootstrap interval (rounds resampled, pairs kept), the ratio of
    minima and the ratio of wall-time medians."""
    rng = random.Random(args.seed)
    baseline = getattr(args, "baseline", PLAIN)  # step_bench_real.py's arguments have no --baseline
    plain = [t[primary] for t in phase_times[baseline]]
    plain_wall = [t[0] for t in phase_times[baseline]]
    rows = []
    for name, measured in phase_times.items():
        values = [t[primary] for t in measured]
        row = {"trainer": name, "median_s": statistics.median(values), "min_s": min(values), "n": len(values)}
        if name != baseline:
            n = len(values)
            paired = [v / p for v, p in zip(values, plain, strict=True)]
            row["ratio"] = row["median_s"] / statistics.median(plain)
            row["ratio_ci"] = bootstrap_interval(
                lambda index, v=values: statistics.median(v[i] for i in index)
                / statistics.median(plain[i] for i in index),
                n, args.bootstrap, rng)
            row["paired"] = statistics.median(paired)
            row["paired_ci"] = bootstrap_interval(lambda index, r=paired: statistics.median(r[i] for i in index),
                                                  n, args.bootstrap, rng)
            row["min_ratio"] = row["min_s"] / min(plain)
            row["wall_ratio"] = statistics.median(t[0] for t in measured) / statistics.median(plain_wall)
        rows.append(row)
    return rows


TITLES = {"step": "full optimizer step (training loop)", "gen": "generate + score (+ advantage strategies)",
          "loss": "loss forward + backward (fixed batch)"}


def print_table(phase: str, rows: list[dict], clock_name: str, baseline: str = PLAIN) -> None:
    print(f"\n{phase}: {TITLES[phase]}, {clock_name} time, n = {rows[0]['n']} rounds")
    shown = "TRL" if baseline == PLAIN else baseline
    print(f"| trainer | median | paired ratio to {shown} | 95% CI | <= 1%? | ratio of medians (95% CI) | min ratio "
          "| wall ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["trainer"] == baseline:
            label = f"{PLAIN} (GRPOTrainer)" if baseline == PLAIN else baseline
            print(f"| {label} | {row['median_s'] * 1e3:.1f} ms | 1 | | | | | |")
            continue
        low, high = row["paired_ci"]
        label = f"{row['trainer']} (A/A control)" if row["trainer"] == CONTROL else row["trainer"]
        print(f"| {label} | {row['median_s'] * 1e3:.1f} ms | {row['paired']:.3f} ({(row['paired'] - 1) * 100:+.1f}%) "
              f"| {low:.3f}-{high:.3f} | {verdict(low, high)} | {row['ratio']:.3f} ({row['ratio_ci'][0]:.3f}-"
              f"{row['ratio_ci'][1]:.3f}) | {row['min_ratio']:.3f} | {row['wall_ratio']:.3f} |")


def report(results: dict, primary: int, clock_name: str, args) -> dict:
    tables = {}
    for phase in ("step", "gen", "loss"):
        if phase in results:
            tables[phase] = summarise(results[phase], primary, args)
            print_table(phase, tables[phase], clock_name, args.baseline)
    return tables


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv=None):
    args = parse_args(argv)
    if args.report is not None:  # re-print the tables of a saved run
        saved = json.loads(args.report.read_text())
        clock_name = saved["args"]["clock"]
        if args.baseline == PLAIN:  # the run's own baseline unless another is asked for (e.g. --baseline equal)
            args.baseline = saved["args"].get("baseline", PLAIN)
        if args.baseline not in saved["times"][next(iter(saved["times"]))]:
            raise SystemExit(f"--baseline {args.baseline} was not timed in {args.report}")
        report(saved["times"], 1 if clock_name == "cpu" else 0, clock_name, args)
        return
    warnings.filterwarnings("ignore")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    if args.clock == "auto":
        args.clock = "cpu" if args.device == "cpu" and torch.get_num_threads() == 1 else "wall"
    primary = 1 if args.clock == "cpu" else 0
    if args.baseline != PLAIN and args.baseline not in args.strategies:
        raise SystemExit(f"--baseline {args.baseline} is neither {PLAIN!r} nor one of --strategies")
    if args.batch_size % args.num_generations:
        raise SystemExit("--batch_size must be a multiple of --num_generations")
    if args.device == "cuda":
        torch.cuda.set_device(0)

    import tempfile

    import trl

    started = time.perf_counter()
    model_path = build_model(args)
    with tempfile.TemporaryDirectory(prefix="step_bench_") as output_root:
        trainers = build_trainers(args, model_path, Path(output_root))
        model = trainers[args.baseline].model
        params = sum(p.numel() for p in model.parameters())
        device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"cpu ({os.cpu_count()} cores)"
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
              f"device {device_name}, dtype {args.dtype}, torch threads {torch.get_num_threads()}, "
              f"primary clock {args.clock}")
        print(f"model {model_path.name}: {model.config.model_type} hidden {model.config.hidden_size} layers "
              f"{model.config.num_hidden_layers} vocabulary {model.config.vocab_size} ({params / 1e6:.2f}M "
              f"params), batch {args.batch_size} completions x {args.max_completion_length} tokens "
              f"({'fixed' if args.fixed_length else 'up to'}), G = {args.num_generations}, loss {args.loss_type}, "
              f"beta {args.beta}, num_iterations {args.num_iterations}; trainers: {', '.join(trainers)}")
        print(f"uniform malloc (one arena, fixed mmap threshold): {UNIFORM_MALLOC}; "
              f"load average before: {load_average()}", flush=True)

        results = {}
        summary = {}
        if "gen" in args.phases or "loss" in args.phases:
            gen_times, loss_times, summary = time_generation_and_loss(trainers, args)
            print(f"fixed batch: completions {summary['completion_shape']}, identical across trainers: "
                  f"{summary['identical_completions']}, mean reward {summary['mean_reward']}", flush=True)
            if "gen" in args.phases:
                results["gen"] = gen_times
            if "loss" in args.phases:
                results["loss"] = loss_times
            print(f"load average after gen/loss: {load_average()}", flush=True)
        if "step" in args.phases:
            results["step"] = time_training_steps(trainers, args)
            print(f"load average after step: {load_average()}", flush=True)
            mixed = {}  # train()'s final log averages the metrics over all its steps
            for name, trainer in trainers.items():
                logs = [entry for entry in trainer.state.log_history if "frac_reward_zero_std" in entry]
                if logs:
                    mixed[name] = 1.0 - float(logs[-1]["frac_reward_zero_std"])
            if mixed:
                print("share of groups with mixed rewards during the steps: "
                      + ", ".join(f"{name} {value:.2f}" for name, value in mixed.items()))

    tables = report(results, primary, args.clock, args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                         "times": results, "tables": tables}, indent=1))


if __name__ == "__main__":
    main()
