"""Every GPU figure the project reports, in one command (benchmarks/RESULTS.md "GPU suite").

    python benchmarks/gpu_suite.py --json gpu_suite.json    # one H100 or H200: at most 8 minutes (--budget_s 450)
    python benchmarks/gpu_suite.py --dry-run                # CPU, tiny shapes, float32: the same code paths

Five parts (``--parts``, all by default); each figure is printed with the command that takes it alone:

1. ``thr``: ``thr_bench.py``'s fused THR score at G = 8, L = 1024 / 2048 / 4096, V = 151936, H = 1536, bf16, once per
   kernel path (``thr_kernels.KERNELS``: torch, triton-tokens, triton), each with its floor (the path's flop count,
   ``thr_kernels.path_flops``, at the bf16 rate measured on an 8192^3 matmul), its peak extra memory, its agreement
   with the torch path at the first length, and each Triton path against the float64 loop reference
   (``thr_triton_tune.reference_error``); then the headline
   ``THR score (G=8, L=4096, V=151936, H=1536, bf16) on <device>: <time> s (floor <floor> s)`` for the path that
   ``auto`` takes, and the same line per path.
2. ``ratios``: ``step_bench_real.py``'s model (Qwen2.5-1.5B's shapes, random weights, built from a config: no Hub)
   and ONE trainer with the variants swapped (plain TRL, its A/A twin ``trl#2``, ``step_bench_real.STRATEGIES``);
   interleaved rounds of the generation phase (generate + score + advantage strategies) and of the loss phase
   (forward + backward of a fixed batch), continued until the A/A control's 95% interval lies within +-2% (at least
   ``--min_rounds``) or the part's share of ``--budget_s`` is spent; paired ratios to TRL (``step_bench.summarise``)
   and peak memory per variant and phase.
3. ``async``: ``async_bench.py``'s paired rounds on the device: synchronous training, its A/A twin and
   ``async_generation`` (``max_staleness`` 1, the rollout process on the same GPU), each a fresh trainer of a tiny
   Qwen2 (``hidden_size``/``num_layers`` of the mode) trained ``steps`` steps on fixed-length completions; median step
   time, completion tokens per second and the paired ratio to ``sync`` with its interval; the headline
   ``async_generation (max_staleness 1) on <device>: <ratio> x sync's step time [<low>, <high>]; A/A <ratio>``.
4. ``strategies``: every strategy in the registry (``sharpgrpo.strategies.STRATEGIES``) trains the same model for
   ``--steps`` optimizer steps in bf16 with ``token_telemetry`` on (one parquet file a step): every logged metric
   finite, one telemetry file per step whose float columns are finite on the loss tokens, and the peak memory.
   Strategies that need settings the suite cannot give (a config check refuses them in one line) are listed as not
   run, with that line; a failure in training is listed as failed and makes the exit status 1.

5. ``moe``: a Qwen3-MoE (random weights, built from a config) trains two optimizer steps (one generation batch,
   ``num_iterations`` 2) with ``routing_replay`` off and on (docs/methods.md §23): every metric finite, and with
   replay the routing agreement of each step (the sampler's experts against the trainer's own, in bf16).

``--dry-run`` (alias ``--cpu-tiny``) runs the same functions on the CPU with tiny shapes and float32, the Triton
paths in Triton's CPU interpreter (``TRITON_INTERPRET=1``), in well under a minute (tests/test_gpu_suite.py runs it).

What it needs: a checkout of this repository (the scripts put it on ``sys.path``; no install) and, on an offline
machine that has torch with CUDA and triton, the wheels in ``OFFLINE_WHEELS`` (the versions this suite was tested
with; ``--wheels`` prints the list computed from the installed environment). Fetch them on a machine with PyPI:

    pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \\
        --platform manylinux_2_28_x86_64 --no-deps -d wheels <the OFFLINE_WHEELS list>

and on the GPU machine: ``pip install --no-index --no-deps wheels/*.whl``; then
``HF_HUB_OFFLINE=1 python benchmarks/gpu_suite.py --json gpu_suite.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PARTS = ("thr", "ratios", "async", "strategies", "moe")

# The project's runtime requirements and theirs, minus torch and its own (the closure of sharpgrpo's requirements
# without torch's, as installed where the suite was tested; tests/test_gpu_suite.py keeps it complete).
OFFLINE_WHEELS = [
    "accelerate==1.15.0", "annotated-doc==0.0.7", "annotated-types==0.8.0", "antlr4-python3-runtime==4.13.2",
    "anyio==4.16.0", "click==8.5.1", "contourpy==1.3.3", "cycler==0.12.1", "datasets==5.2.0", "dill==0.4.1",
    "fonttools==4.68.0", "h11==0.16.0", "hf-xet==1.8.0", "httpcore2==2.16.2", "httpx2==2.16.2",
    "huggingface-hub==2.4.0", "idna==3.20", "kiwisolver==1.5.1", "latex2sympy2-extended==1.11.0",
    "markdown-it-py==4.3.0", "math-verify==0.9.0", "matplotlib==3.11.2", "mdurl==0.1.2", "multiprocess==0.70.19",
    "numpy==2.4.6", "packaging==26.4", "pandas==3.1.1", "peft==0.21.2", "pillow==13.0.0", "psutil==7.2.2",
    "pyarrow==26.0.1", "pydantic==2.14.4", "pydantic-core==2.50.5", "pygments==2.21.0", "pyparsing==3.3.3",
    "python-dateutil==4.0.0", "pyyaml==6.0.4", "regex==2026.11.19", "rich==15.0.0", "safetensors==0.8.0",
    "shellingham==1.5.4", "tokenizers==0.23.3", "tqdm==4.70.1", "transformers==5.24.0", "trl==1.16.0",
    "truststore==0.10.5", "typer==0.29.2", "typing-inspection==0.4.5", "tzdata==2026.6", "xxhash==4.1.0",
]
DOWNLOAD = ("pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 "
            "--platform manylinux_2_28_x86_64 --no-deps -d wheels")

# Shapes and rounds of each mode. GPU: the figures RESULTS.md reports; dry run: the same code at toy sizes.
MODES = {
    "gpu": {
        "device": "cuda", "dtype": "bfloat16", "budget_s": 450.0,
        "thr": {"G": 8, "lengths": [1024, 2048, 4096], "vocab": 151936, "hidden": 1536, "repeats": 3,
                "chunk_size": 1024, "rate_size": 8192, "reference_seeds": (40, 41, 42)},
        "ratios": {"shape": "QWEN25_15B", "batch_size": 16, "micro_batch": 8, "num_generations": 8,
                   "prompt_length": 64, "max_completion_length": 128, "warmup": 1, "min_rounds": 4,
                   "max_rounds": 40, "loss_min_rounds": 10, "loss_max_rounds": 60},
        "async": {"hidden_size": 1024, "num_layers": 8, "warm_start_steps": 0, "batch_size": 32,
                  "num_generations": 8, "max_completion_length": 128, "steps": 8, "warmup": 2, "rounds": 3,
                  "max_staleness": 1, "seconds": 100.0},
        "strategies": {"batch_size": 16, "micro_batch": 8, "num_generations": 8, "prompt_length": 32,
                       "max_completion_length": 32, "steps": 2, "seconds_each": 8.0},
        "moe": {"shape": {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
                          "num_key_value_heads": 4, "head_dim": 64, "num_experts": 32, "num_experts_per_tok": 4,
                          "moe_intermediate_size": 512},
                "batch_size": 16, "num_generations": 8, "prompt_length": 32, "max_completion_length": 64, "steps": 2},
    },
    "dry": {
        "device": "cpu", "dtype": "float32", "budget_s": 3600.0,  # fixed rounds: the budget never cuts a part short
        "thr": {"G": 4, "lengths": [4, 8, 16], "vocab": 256, "hidden": 32, "repeats": 1, "chunk_size": 32,
                "rate_size": 256, "reference_seeds": (40,)},
        "ratios": {"shape": "SMALL", "batch_size": 8, "micro_batch": 4, "num_generations": 4, "prompt_length": 8,
                   "max_completion_length": 6, "warmup": 0, "min_rounds": 2, "max_rounds": 2,
                   "loss_min_rounds": 2, "loss_max_rounds": 2},
        "async": {"hidden_size": 32, "num_layers": 2, "warm_start_steps": 0, "batch_size": 8, "num_generations": 4,
                  "max_completion_length": 4, "steps": 3, "warmup": 1, "rounds": 1, "max_staleness": 1,
                  "seconds": 60.0},
        "strategies": {"batch_size": 8, "micro_batch": 4, "num_generations": 4, "prompt_length": 8,
                       "max_completion_length": 4, "steps": 1, "seconds_each": 1.0},
        "moe": {"shape": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 32},
                "batch_size": 4, "num_generations": 4, "prompt_length": 8, "max_completion_length": 4, "steps": 2},
    },
}
CONTROL_BAND = (0.98, 1.02)  # the A/A control's 95% interval must lie inside for the ratios to resolve 2%


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", "--cpu-tiny", dest="dry_run", action="store_true",
                        help="CPU, tiny shapes, float32, Triton in its CPU interpreter: the same code paths")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--budget_s", type=float, default=None,
                        help="wall-clock budget of the whole run in seconds (default 450 on a GPU; the dry run's "
                        "fixed rounds are not cut short)")
    parser.add_argument("--strategies", nargs="+", default=None,
                        help="part strategies: these registered strategies only (default: every one)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--wheels", action="store_true",
                        help="print the pip download command for the installed environment's wheels and exit")
    return parser.parse_args(argv)


def emit(line: str = "") -> None:
    print(line, flush=True)


def gib(value) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


# ----------------------------------------------------------------------------------------------------------------
# Wheels
# ----------------------------------------------------------------------------------------------------------------
def requirement_closure(name: str) -> dict[str, str | None]:
    """{normalised distribution name: installed version (None if not installed)} of ``name`` and everything its
    installed metadata requires (extras left out), transitively."""
    import importlib.metadata as metadata
    import re

    from packaging.requirements import Requirement

    found: dict[str, str | None] = {}
    stack = [name]
    while stack:
        current = stack.pop()
        key = re.sub(r"[-_.]+", "-", current).lower()
        if key in found:
            continue
        try:
            distribution = metadata.distribution(current)
        except metadata.PackageNotFoundError:
            found[key] = None
            continue
        found[key] = distribution.version
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                stack.append(requirement.name)
    return found


def offline_requirements() -> list[str]:
    """``name==version`` of what the project needs beyond torch, from the installed environment."""
    project, torch_own = requirement_closure("sharpgrpo"), requirement_closure("torch")
    return sorted(f"{name}=={version}" for name, version in project.items()
                  if name not in torch_own and name != "sharpgrpo" and version is not None)


# ----------------------------------------------------------------------------------------------------------------
# Part 1: THR score per kernel path
# ----------------------------------------------------------------------------------------------------------------
def thr_part(mode: dict, device_name: str) -> dict:
    import torch

    import thr_bench
    import thr_triton_tune
    from sharpgrpo.strategies import thr_kernels
    from sharpgrpo.strategies.thr import token_hidden_reward_scores

    cfg, device = mode["thr"], torch.device(mode["device"])
    bf16 = mode["dtype"] == "bfloat16"
    paths = [p for p in thr_kernels.KERNELS if p != "auto"]
    base = ["--device", mode["device"], "--dtype", mode["dtype"], "--matmul-dtype", "bfloat16" if bf16 else "float32",
            "--G", str(cfg["G"]), "--vocab", str(cfg["vocab"]), "--hidden", str(cfg["hidden"]),
            "--chunk-size", str(cfg["chunk_size"]), "--repeats", str(cfg["repeats"]), "--methods", "fused",
            "--rate-size", str(cfg["rate_size"]), "--lengths", *map(str, cfg["lengths"])]
    result = {"paths": {}, "reference_rel_err": {}, "agreement_with_torch": {}, "errors": {}}

    def attempt(what, fn):
        """fn(), or None with the error recorded: one path that does not build must not cost the others' figures."""
        try:
            return fn()
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            result["errors"][what] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            emit(f"{what} FAILED: {result['errors'][what]}")
            return None

    def with_path(path, fn):
        saved = thr_kernels.DEFAULT_KERNEL  # thr_bench.main sets the module's default path
        thr_kernels.DEFAULT_KERNEL = path
        try:
            return fn()
        finally:
            thr_kernels.DEFAULT_KERNEL = saved

    for path in paths:
        command = ["python", "benchmarks/thr_bench.py", *base, "--fused-kernel", path]
        emit(f"\n$ {' '.join(command)}")
        bench = attempt(f"thr_bench {path}", lambda p=path: with_path(p, lambda: thr_bench.main([*base,
                                                                                                "--fused-kernel", p])))
        if bench is not None:
            result["paths"][path] = {"command": " ".join(command), "rate": bench["rate"], "rows": bench["rows"]}
        if path != "torch":
            error = attempt(f"reference {path}", lambda p=path: thr_triton_tune.reference_error(
                device, p, cfg["reference_seeds"]))
            if error is not None:
                result["reference_rel_err"][path] = error

    # the paths' agreement on one bf16 group of the first length (relative to the largest score)
    gen = torch.Generator().manual_seed(0)
    length, dtype = cfg["lengths"][0], torch.bfloat16 if bf16 else torch.float32
    weight = (torch.randn(cfg["vocab"], cfg["hidden"], generator=gen) * (2.0 / cfg["hidden"] ** 0.5)).to(device, dtype)
    hidden = torch.randn(cfg["G"], length, cfg["hidden"], generator=gen).to(device, dtype)
    ids = torch.randint(0, cfg["vocab"], (cfg["G"], length), generator=gen).to(device)
    mask = torch.ones(cfg["G"], length, dtype=torch.long, device=device)
    positive = (torch.arange(cfg["G"]) < cfg["G"] // 2).to(device)
    scores = {}
    for path in paths:
        score = attempt(f"agreement {path}", lambda p=path: with_path(p, lambda: token_hidden_reward_scores(
            hidden, ids, mask, positive, weight, None, 1.0, "full", cfg["chunk_size"], method="fused",
            matmul_dtype=torch.bfloat16 if bf16 else None).scores))
        if score is not None:
            scores[path] = score
    for path in paths[1:]:
        if path in scores and "torch" in scores:
            reference = scores["torch"]
            result["agreement_with_torch"][path] = float((scores[path] - reference).abs().max()
                                                         / reference.abs().max().clamp(min=1e-30))

    auto = thr_kernels.resolve_kernel("auto", device)
    result["auto_path"] = auto
    emit(f"\nTHR score per kernel path ({mode['dtype']}, G={cfg['G']}, V={cfg['vocab']}, H={cfg['hidden']}; floor: "
         f"the path's flops at the measured matmul rate; peak: extra memory above the inputs):")
    emit("| path | L | time | floor | time / floor | peak extra memory | agreement with torch (L = "
         f"{length}) | vs float64 reference |")
    emit("|---|---|---|---|---|---|---|---|")
    for path, entry in result["paths"].items():
        for row in entry["rows"]:
            agreement = result["agreement_with_torch"].get(path)
            error = result["reference_rel_err"].get(path)
            emit(f"| {path} | {row['L']} | {row['thr_s']:.4g} s | {row['method_floor_s']:.4g} s | "
                 f"{row['thr_s'] / row['method_floor_s']:.2f}x | {thr_bench.fmt_bytes(row['thr_peak_bytes'])} | "
                 f"{'-' if agreement is None else f'{agreement:.1e}'} | {'-' if error is None else f'{error:.1e}'} |")
    last = cfg["lengths"][-1]
    shape = f"G={cfg['G']}, L={last}, V={cfg['vocab']}, H={cfg['hidden']}, {'bf16' if bf16 else mode['dtype']}"
    result["headlines"] = {}
    for path in [auto, *[p for p in paths if p != auto]]:
        if path not in result["paths"]:
            continue
        row = next(r for r in result["paths"][path]["rows"] if r["L"] == last)
        line = (f"THR score ({shape}) on {device_name}: {row['thr_s']:.3g} s (floor {row['method_floor_s']:.3g} s)"
                + ("" if path == auto else f" [kernel path {path}]"))
        result["headlines"][path] = line
    if auto in result["headlines"]:
        emit(f"\n{result['headlines'][auto]}")
        emit(f"  (kernel path {auto}, the one `auto` takes; command: {result['paths'][auto]['command']})")
    for path, line in result["headlines"].items():
        if path != auto:
            emit(line)
    return result  # with errors (a path that failed), main() reports the part as failed; the other figures stand


# ----------------------------------------------------------------------------------------------------------------
# Part 2: generation- and loss-phase ratios to plain TRL at Qwen2.5-1.5B shapes
# ----------------------------------------------------------------------------------------------------------------
def build_model(mode: dict, shape_name: str):
    import torch

    import step_bench_real as real

    shape = getattr(real, shape_name)
    tokenizer = real.build_tokenizer(shape["vocab_size"])
    dtype = torch.bfloat16 if mode["dtype"] == "bfloat16" else torch.float32
    return real.build_model(shape, tokenizer, mode["device"], dtype), tokenizer


def control_within_band(rows: list[dict]) -> bool:
    from step_bench import CONTROL

    control = next(r for r in rows if r["trainer"] == CONTROL)
    low, high = control["paired_ci"]
    return CONTROL_BAND[0] <= low and high <= CONTROL_BAND[1]


def ratios_part(mode: dict, model, tokenizer, deadline: float) -> dict:
    import contextlib

    import torch
    from trl.trainer.utils import split_tensor_dict

    import step_bench_real as real
    from step_bench import CONTROL, PLAIN, clocks, print_table, rotated, summarise

    cfg = mode["ratios"]
    args = argparse.Namespace(device=mode["device"], dtype=mode["dtype"], seed=0, bootstrap=1000, **{
        k: cfg[k] for k in ("batch_size", "micro_batch", "num_generations", "prompt_length", "max_completion_length")})
    primary = 1 if mode["device"] == "cpu" and torch.get_num_threads() == 1 else 0
    clock_name = "cpu" if primary else "wall"
    names = [PLAIN, CONTROL, *real.STRATEGIES]
    num_micro = args.batch_size // args.micro_batch
    result = {"variants": names, "phases": {}}
    with tempfile.TemporaryDirectory(prefix="gpu_suite_ratios_") as output_dir:
        trainer = real.build_trainer(args, model, tokenizer, output_dir)

        def generate(name, round_index):
            gen_fn, _ = real.use_variant(trainer, name)
            rows = real.generation_rows(trainer, args, round_index)
            torch.manual_seed(args.seed + round_index)
            real.synchronize(args.device)
            real.peak_reset(args.device)
            start = clocks()
            output = gen_fn(rows)
            real.synchronize(args.device)
            end = clocks()
            return output, (end[0] - start[0], end[1] - start[1]), real.peak_bytes(args.device)

        def loss_backward(name, batch):
            _, loss_fn = real.use_variant(trainer, name)
            trainer.model.zero_grad(set_to_none=True)
            real.synchronize(args.device)
            real.peak_reset(args.device)
            start = clocks()
            for micro in split_tensor_dict(batch, num_micro):
                loss_fn(micro).backward()
            real.synchronize(args.device)
            end = clocks()
            return (end[0] - start[0], end[1] - start[1]), real.peak_bytes(args.device)

        started = time.perf_counter()
        fixed = {name: generate(name, 10**6)[0] for name in names}  # each variant's own batch for the loss phase
        identical = all(torch.equal(fixed[n]["completion_ids"], fixed[PLAIN]["completion_ids"]) for n in names)
        per_gen_round = time.perf_counter() - started  # one call per variant: about one round
        gen_deadline = time.perf_counter() + 0.85 * max(0.0, deadline - time.perf_counter())  # loss rounds: ~1 s

        def run_phase(phase, one, min_rounds, max_rounds, phase_deadline, seconds_per_round):
            times = {n: [] for n in names}
            peaks = {n: None for n in names}
            rows, round_index = None, 0
            while True:
                round_started = time.perf_counter()
                if args.device == "cuda":  # as step_bench_real.py; on the CPU it would cost more than a dry round
                    gc.collect()
                for name in rotated(names, round_index):
                    elapsed, peak = one(name, round_index)
                    if round_index >= cfg["warmup"]:
                        times[name].append(elapsed)
                        peaks[name] = peak if peaks[name] is None else max(peaks[name], peak)
                round_index += 1
                if round_index > 1:  # the first round pays the warm-up; later ones estimate the next
                    seconds_per_round = time.perf_counter() - round_started
                timed = round_index - cfg["warmup"]
                if timed >= min_rounds:
                    rows = summarise(times, primary, args)
                    if control_within_band(rows) or timed >= max_rounds:
                        break
                if timed >= 1 and time.perf_counter() + seconds_per_round > phase_deadline:
                    break
            rows = summarise(times, primary, args)
            print_table(phase, rows, clock_name)
            control = next(r for r in rows if r["trainer"] == CONTROL)
            ok = control_within_band(rows)
            emit(f"A/A control ({phase}): {control['paired']:.3f} ({control['paired_ci'][0]:.3f}-"
                 f"{control['paired_ci'][1]:.3f}), within +-2%: {'yes' if ok else 'NO (more rounds needed)'}; "
                 f"{timed} rounds")
            return {"times": times, "table": rows, "peaks": peaks, "rounds": timed, "control_within_2pct": ok}

        result["identical_completions"] = identical
        result["phases"]["gen"] = run_phase(
            "gen", lambda name, r: generate(name, r)[1:], cfg["min_rounds"], cfg["max_rounds"], gen_deadline,
            per_gen_round)
        loss_started = time.perf_counter()
        loss_sample = loss_backward(PLAIN, fixed[PLAIN])[0][0] * len(names)
        result["phases"]["loss"] = run_phase(
            "loss", lambda name, r: loss_backward(name, fixed[name]), cfg["loss_min_rounds"], cfg["loss_max_rounds"],
            max(deadline, loss_started + loss_sample * (cfg["loss_min_rounds"] + cfg["warmup"])), loss_sample)
        trainer.model.zero_grad(set_to_none=True)
        for store in trainer._metrics.values():
            store.clear()
        del trainer, fixed
        with contextlib.suppress(Exception):
            gc.collect()
            if mode["device"] == "cuda":
                torch.cuda.empty_cache()
    emit("\n| variant | peak memory, generation phase | peak memory, loss phase |")
    emit("|---|---|---|")
    for name in names:
        emit(f"| {name} | {gib(result['phases']['gen']['peaks'][name])} | "
             f"{gib(result['phases']['loss']['peaks'][name])} |")
    emit(f"identical completions across variants: {identical}")
    return result


# ----------------------------------------------------------------------------------------------------------------
# Part 3: every registered strategy, a few bf16 steps with token telemetry
# ----------------------------------------------------------------------------------------------------------------
def async_part(mode: dict, deadline: float) -> dict:
    """``async_bench.py``'s paired rounds (the module docstring, part 3) until ``deadline``."""
    import async_bench

    args = async_bench.parse_args(["--device", mode["device"]])
    for key, value in mode["async"].items():
        if key != "seconds":
            setattr(args, key, value)
    results = async_bench.paired_rounds(args, async_bench.build_model(args), deadline)
    variants = results["variants"]
    ours, control = variants["async"], variants["sync#2"]
    emit(f"async_generation (max_staleness {args.max_staleness}) on {mode['device']}: "
         f"{ours['paired_ratio']:.3f} x sync's step time [{ours['interval'][0]:.3f}, {ours['interval'][1]:.3f}]; "
         f"A/A {control['paired_ratio']:.3f} ({results['rounds']} rounds; sync {variants['sync']['tokens_per_second']:.0f}"
         f", async {ours['tokens_per_second']:.0f} completion tokens/s)")
    return results


def strategy_options(name: str) -> dict:
    """Config fields a strategy needs beyond the defaults: learning_bench.STRATEGY_OPTIONS (CLI pairs) as kwargs."""
    import learning_bench

    pairs = learning_bench.STRATEGY_OPTIONS.get(name, [])
    options = {}
    for flag, value in zip(pairs[::2], pairs[1::2], strict=True):
        options[flag.lstrip("-")] = int(value) if value.isdigit() else value
    return options


def telemetry_problems(files: list[Path]) -> list[str]:
    """``file:column`` for every float column of the telemetry files with a NaN on a loss token (mask 1), unless the
    column is wholly NaN there (a column the run does not fill), or an infinity outside the clip-bound columns
    (``.../epsilon_low``, ``.../epsilon_high``: infinite means no clip, e.g. kl_cov's and DPPO's selected tokens)."""
    import numpy as np
    import pyarrow.parquet as pq

    problems = []
    for path in files:
        table = pq.read_table(path)
        mask = table.column("mask").to_numpy() > 0 if "mask" in table.column_names else None
        for name in table.column_names:
            values = table.column(name).to_numpy(zero_copy_only=False)
            if not np.issubdtype(values.dtype, np.floating):
                continue
            values = values[mask] if mask is not None else values
            nan = np.isnan(values)
            bound = name.endswith(("epsilon_low", "epsilon_high"))
            if (nan.any() and not nan.all()) or (not bound and np.isinf(values).any()):
                problems.append(f"{path.name}:{name}")
    return problems


def strategies_part(mode: dict, model, tokenizer, names: list[str], deadline: float) -> dict:
    import torch

    from transformers import PrinterCallback, ProgressCallback

    import step_bench_real as real
    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer

    cfg = mode["strategies"]
    device = mode["device"]
    results = {}
    emit(f"\nEvery registered strategy, {cfg['steps']} optimizer step(s) each, {mode['dtype']}, "
         f"{cfg['batch_size']} completions x {cfg['max_completion_length']} tokens, token_telemetry on:")
    emit("| strategy | status | steps logged | non-finite metrics | telemetry files | non-finite telemetry | "
         "peak memory | seconds |")
    emit("|---|---|---|---|---|---|---|---|")
    dataset = real.prompt_dataset(8 * cfg["steps"] * cfg["batch_size"] // cfg["num_generations"] + 8,
                                  cfg["prompt_length"], model.config.vocab_size, 0)
    for index, name in enumerate(names):
        if time.perf_counter() > deadline:
            results[name] = {"status": "not run", "reason": "the run's time budget was spent"}
            emit(f"| {name} | not run: time budget spent | | | | | | |")
            continue
        with tempfile.TemporaryDirectory(prefix=f"gpu_suite_{name}_") as output_dir:
            started = time.perf_counter()
            try:
                config = SharpGRPOConfig(
                    output_dir=output_dir, report_to=[], use_cpu=device == "cpu", bf16=mode["dtype"] == "bfloat16",
                    per_device_train_batch_size=cfg["micro_batch"],
                    gradient_accumulation_steps=cfg["batch_size"] // cfg["micro_batch"],
                    num_generations=cfg["num_generations"], max_completion_length=cfg["max_completion_length"],
                    generation_kwargs={"min_new_tokens": cfg["max_completion_length"]}, temperature=1.0, beta=0.0,
                    learning_rate=1e-6, max_steps=cfg["steps"], logging_steps=1, save_strategy="no",
                    disable_tqdm=True, seed=index, strategies=[name], token_telemetry=True, telemetry_steps=1,
                    **strategy_options(name))
                trainer = SharpGRPOTrainer(model=model, reward_funcs=[real.hashed_binary_reward], args=config,
                                           train_dataset=dataset, processing_class=tokenizer)
                trainer.remove_callback(PrinterCallback)  # the table below says what the log lines would
                trainer.remove_callback(ProgressCallback)
            except (ValueError, TypeError) as error:  # a config check: the strategy needs what the suite lacks
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                results[name] = {"status": "not run", "reason": reason}
                emit(f"| {name} | not run: {reason} | | | | | | |")
                continue
            try:
                real.peak_reset(device)
                trainer.train()
                real.synchronize(device)
            except Exception as error:  # noqa: BLE001 - report and go on: the other strategies' figures still count
                results[name] = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
                emit(f"| {name} | FAILED: {type(error).__name__}: {str(error).splitlines()[0][:200]} | | | | | | |")
                traceback.print_exc()
                del trainer
                continue
            peak = real.peak_bytes(device)
            logs = [entry for entry in trainer.state.log_history if "loss" in entry]
            bad = sorted({key for entry in logs for key, value in entry.items()
                          if isinstance(value, float) and not math.isfinite(value)})
            files = sorted((Path(output_dir) / "telemetry").glob("telemetry_*.parquet"))
            telemetry_bad = telemetry_problems(files)
            ok = len(logs) == cfg["steps"] and not bad and len(files) == cfg["steps"] and not telemetry_bad
            seconds = time.perf_counter() - started
            results[name] = {"status": "ok" if ok else "failed", "steps_logged": len(logs), "nonfinite": bad,
                             "telemetry_files": len(files), "telemetry_nonfinite": telemetry_bad,
                             "peak_bytes": peak, "seconds": seconds, "metrics": logs}
            emit(f"| {name} | {'ok' if ok else 'FAILED'} | {len(logs)} | {', '.join(bad) or 'none'} | {len(files)} | "
                 f"{', '.join(telemetry_bad) or 'none'} | {gib(peak)} | {seconds:.1f} |")
            del trainer
            if device == "cuda":  # (gc.collect takes most of a tiny CPU step in this process)
                gc.collect()
                torch.cuda.empty_cache()
    return results


def moe_part(mode: dict, tokenizer) -> dict:
    """A Qwen3-MoE built from a config (random weights) at ``mode["moe"]["shape"]`` trains ``steps`` optimizer steps
    (one generation batch trained on twice: ``num_iterations`` 2) with routing replay off and on, in the mode's dtype:
    every logged metric finite, and with replay the routing agreement of each step (docs/methods.md §23)."""
    from transformers import AutoModelForCausalLM, PrinterCallback, ProgressCallback, Qwen3MoeConfig

    import step_bench_real as real
    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer

    cfg, device = mode["moe"], mode["device"]
    import torch

    dtype = torch.bfloat16 if mode["dtype"] == "bfloat16" else torch.float32
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=False,
                            max_position_embeddings=4096, **cfg["shape"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
    params = sum(p.numel() for p in model.parameters())
    dataset = real.prompt_dataset(8 * cfg["batch_size"], cfg["prompt_length"], len(tokenizer), 0)
    emit(f"\nQwen3-MoE {cfg['shape']} ({params / 1e6:.1f}M parameters, random weights), {mode['dtype']}, "
         f"{cfg['batch_size']} completions x {cfg['max_completion_length']} tokens, num_iterations 2:")
    emit("| routing_replay | status | steps logged | non-finite metrics | routing agreement per step | peak memory | "
         "seconds |")
    emit("|---|---|---|---|---|---|---|")
    results = {}
    for replay in (False, True):
        with tempfile.TemporaryDirectory(prefix="gpu_suite_moe_") as output_dir:
            started = time.perf_counter()
            args = SharpGRPOConfig(
                output_dir=output_dir, report_to=[], use_cpu=device == "cpu", bf16=mode["dtype"] == "bfloat16",
                per_device_train_batch_size=cfg["batch_size"], num_generations=cfg["num_generations"],
                max_completion_length=cfg["max_completion_length"],
                generation_kwargs={"min_new_tokens": cfg["max_completion_length"]}, temperature=1.0,
                num_iterations=2, learning_rate=1e-5, max_steps=cfg["steps"], logging_steps=1, save_strategy="no",
                disable_tqdm=True, seed=0, strategies=["equal"], routing_replay=replay)
            trainer = SharpGRPOTrainer(model=model, reward_funcs=[real.hashed_binary_reward], args=args,
                                       train_dataset=dataset, processing_class=tokenizer)
            trainer.remove_callback(PrinterCallback)
            trainer.remove_callback(ProgressCallback)
            real.peak_reset(device)
            trainer.train()
            real.synchronize(device)
            peak = real.peak_bytes(device)
            logs = [entry for entry in trainer.state.log_history if "loss" in entry]
            bad = sorted({key for entry in logs for key, value in entry.items()
                          if isinstance(value, float) and not math.isfinite(value)})
            agreement = [entry.get("routing_replay/agreement") for entry in logs]
            ok = len(logs) == cfg["steps"] and not bad and (not replay or None not in agreement)
            seconds = time.perf_counter() - started
            results["on" if replay else "off"] = {"status": "ok" if ok else "failed", "steps_logged": len(logs),
                                                  "nonfinite": bad, "agreement": agreement, "peak_bytes": peak,
                                                  "seconds": seconds}
            shown = ", ".join(f"{a:.5f}" for a in agreement) if replay and None not in agreement else "-"
            emit(f"| {replay} | {'ok' if ok else 'FAILED'} | {len(logs)} | {', '.join(bad) or 'none'} | {shown} | "
                 f"{gib(peak)} | {seconds:.1f} |")
            if getattr(trainer, "_routing_replay", None) is not None:  # the next trainer trains the same model
                trainer._routing_replay.remove()
            del trainer
    failed = [name for name, entry in results.items() if entry["status"] != "ok"]
    if failed:
        results["errors"] = f"routing_replay {failed} failed"
    return results


# ----------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.wheels:
        emit(f"{DOWNLOAD} {' '.join(offline_requirements())}")
        return 0
    mode = MODES["dry" if args.dry_run else "gpu"]
    if args.dry_run:  # before triton is imported: its kernels then run in the CPU interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    for path in (ROOT, BENCH, ROOT / "tests" / "strategies"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import step_bench  # noqa: F401  (sets the malloc options before torch starts threads)
    import step_bench_real
    import torch
    import transformers
    import trl

    from sharpgrpo.strategies import STRATEGIES

    if args.dry_run:
        torch.set_num_threads(1)  # the primary clock is then the process CPU time (step_bench.py)
    if mode["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_suite.py needs a CUDA device (or --dry-run for the CPU run at tiny shapes)")
    import warnings

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    started = time.perf_counter()
    deadline = started + (args.budget_s or mode["budget_s"])
    device_name = torch.cuda.get_device_name(0) if mode["device"] == "cuda" else f"cpu ({os.cpu_count()} cores)"
    commit = os.popen(f"git -C {ROOT} rev-parse --short HEAD 2>/dev/null").read().strip() or "unknown"
    emit(f"gpu_suite.py{' --dry-run' if args.dry_run else ''}: device {device_name}; torch {torch.__version__}, "
         f"transformers {transformers.__version__}, trl {trl.__version__}; commit {commit}; parts {args.parts}")
    names = args.strategies or STRATEGIES.names()
    unknown = sorted(set(names) - set(STRATEGIES.names()))
    if unknown:
        raise SystemExit(f"--strategies: not registered: {unknown} (registered: {STRATEGIES.names()})")
    results = {"device": device_name, "commit": commit, "dry_run": args.dry_run, "errors": {}}

    def run(part, fn):
        emit(f"\n==== {part} ({time.perf_counter() - started:.0f} s) ====")
        try:
            results[part] = fn()
            if results[part].get("errors"):
                results["errors"][part] = results[part]["errors"]
        except Exception as error:  # noqa: BLE001 - the other parts' figures still come out
            traceback.print_exc()
            results["errors"][part] = f"{type(error).__name__}: {error}"
            emit(f"part {part} FAILED: {type(error).__name__}: {error}")

    if "thr" in args.parts:
        run("thr", lambda: thr_part(mode, device_name))
    model = tokenizer = None
    if "ratios" in args.parts or "strategies" in args.parts:
        model, tokenizer = build_model(mode, mode["ratios"]["shape"])
        params = sum(p.numel() for p in model.parameters())
        emit(f"\nmodel: Qwen2 {getattr(step_bench_real, mode['ratios']['shape'])} "
             f"({params / 1e6:.1f}M parameters, random weights, built from a config), {mode['dtype']}")
    reserve_strategies = mode["strategies"]["seconds_each"] * len(names) if "strategies" in args.parts else 0.0
    reserve_async = mode["async"]["seconds"] if "async" in args.parts else 0.0
    if "ratios" in args.parts:
        run("ratios", lambda: ratios_part(mode, model, tokenizer, deadline - reserve_strategies - reserve_async))
        emit(f"command (this part alone): python benchmarks/gpu_suite.py --parts ratios"
             f"{' --dry-run' if args.dry_run else ''}")
    if "async" in args.parts:
        run("async", lambda: async_part(mode, deadline - reserve_strategies))
        emit(f"command (this part alone): python benchmarks/gpu_suite.py --parts async"
             f"{' --dry-run' if args.dry_run else ''}")
    if "strategies" in args.parts:
        run("strategies", lambda: strategies_part(mode, model, tokenizer, names, deadline))
        emit(f"command (this part alone): python benchmarks/gpu_suite.py --parts strategies"
             f"{' --dry-run' if args.dry_run else ''}")
    if "moe" in args.parts:
        moe_tokenizer = tokenizer or step_bench_real.build_tokenizer(
            getattr(step_bench_real, mode["ratios"]["shape"])["vocab_size"])
        run("moe", lambda: moe_part(mode, moe_tokenizer))
        emit(f"command (this part alone): python benchmarks/gpu_suite.py --parts moe"
             f"{' --dry-run' if args.dry_run else ''}")
    failed = [n for n, r in results.get("strategies", {}).items() if r["status"] == "failed"]
    results["total_s"] = time.perf_counter() - started
    emit(f"\ntotal {results['total_s']:.0f} s; parts failed: {sorted(results['errors']) or 'none'}; strategies "
         f"failed: {failed or 'none'}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 1 if results["errors"] or failed else 0


if __name__ == "__main__":
    sys.exit(main())
