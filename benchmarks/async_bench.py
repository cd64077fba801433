"""Wall time per training step of asynchronous generation (``async_generation``) against synchronous training.

Three variants train the same model from the same seed: ``sync`` (SharpGRPOTrainer generating itself), ``sync#2``
(the same again: the A/A control, whose ratio to ``sync`` is the benchmark's own noise on the machine of the run) and
``async`` (generation in the rollout process, ``--max_staleness`` batches ahead). Each round trains every variant
once, ``--steps`` optimizer steps in a fresh trainer (the rollout process's start included in the run but not in the
timed steps), in an order rotated by the round so that load drifts hit all variants alike. A callback records the
wall time of every step from one ``on_step_end`` to the next (so a step includes the trainer's wait for its batch);
the first ``--warmup`` steps of a run are left out. Per variant: the median step time over all timed steps of all
rounds, completion tokens per second (TRL's ``num_tokens`` over the timed steps' wall time), and the paired ratio
to ``sync`` (the median over rounds of the round's median step time over ``sync``'s, with a 95% bootstrap interval).

The workload: the demo's prompts, the binary reward of ``step_bench.py``, completions of exactly
``--max_completion_length`` tokens, a tiny Qwen2 sized by ``--hidden_size``/``--num_layers`` so that generation is
a real share of the step. The trainer and the rollout process each use ``--threads`` intra-op threads: on a
machine with fewer cores than both together, they compete, and the overlap buys little; that is what this measures.

    python benchmarks/async_bench.py                                    # CPU, a few minutes
    python benchmarks/async_bench.py --rounds 6 --steps 12 --threads 1 --max_staleness 2
    python benchmarks/async_bench.py --device cuda --hidden_size 1024 --num_layers 8 --max_completion_length 128

On a GPU, benchmarks/gpu_suite.py runs the same rounds as its ``async`` part.

With ``--vllm_server start`` (or a server's URL) every variant generates with a real vLLM server instead
(``use_vllm: true, vllm_mode: server``): ``sync`` is synchronous server mode (TRL syncs the weights and waits for
each batch), ``async`` asks the server ``--max_staleness`` batches ahead from a thread while the trainer trains
(docs/methods.md §20). ``start`` launches ``sharpgrpo vllm-serve`` on ``--model`` in float32 (the trainer's dtype) for
the whole benchmark; run it in the environment that has vLLM (``.venv-vllm``):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/async_bench.py --vllm_server start \
        --model sharpgrpo-tiny-vllm --threads 1
    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/async_bench.py --vllm_server start \
        --model sharpgrpo-smol --threads 1 --batch_size 16 --max_completion_length 16 --steps 5 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from step_bench import bootstrap_interval, build_model, load_average, make_binary_reward  # noqa: E402

VARIANTS = ("sync", "sync#2", "async")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run not timed")
    parser.add_argument("--max_staleness", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the trainer and of the rollout "
                        "process each")
    parser.add_argument("--architecture", default="qwen2")
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--warm_start_steps", type=int, default=300)
    parser.add_argument("--model_dir", type=Path, default=None)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--max_completion_length", type=int, default=32)
    parser.add_argument("--reward_threshold", type=float, default=0.625)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="a model name or folder to train instead of the built tiny Qwen2 "
                        "(e.g. sharpgrpo-tiny-vllm, sharpgrpo-smol)")
    parser.add_argument("--vllm_server", default=None, help="'start' (launch sharpgrpo vllm-serve on --model) or a "
                        "running server's URL: every variant generates with it")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the trainer and the rollout process on the GPU, in bf16")
    parser.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    return parser.parse_args(argv)


def run_once(variant: str, args, model_path: Path, folder: Path) -> tuple[list[float], float]:
    """Train one fresh trainer ``args.steps`` steps; returns (timed step seconds, completion tokens in them)."""
    from transformers import AutoTokenizer, TrainerCallback

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
    from sharpgrpo.data.demo import demo_dataset

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    extra = {"async_generation": True, "max_staleness": args.max_staleness} if variant == "async" else {}
    if args.vllm_server:
        extra |= {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": args.vllm_server}
    config = SharpGRPOConfig(
        output_dir=str(folder), report_to=[], use_cpu=args.device == "cpu", bf16=args.device == "cuda",
        strategies=["equal"],
        per_device_train_batch_size=args.batch_size, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        generation_kwargs={"min_tokens" if args.vllm_server else "min_new_tokens": args.max_completion_length},
        learning_rate=1e-4,
        max_steps=args.steps, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=args.seed, **extra)
    trainer = SharpGRPOTrainer(model=str(model_path), reward_funcs=[make_binary_reward(args.reward_threshold)],
                               args=config, train_dataset=demo_dataset(4096),
                               processing_class=AutoTokenizer.from_pretrained(model_path), callbacks=[Clock()])
    stamps.append(time.perf_counter())
    trainer.train()
    if trainer.rollout_func is not None:
        trainer.rollout_func.close()
    steps = [later - earlier for earlier, later in zip(stamps, stamps[1:])][args.warmup:]
    logged = [entry["num_tokens"] for entry in trainer.state.log_history if "num_tokens" in entry]
    tokens = logged[-1] - logged[args.warmup - 1] if args.warmup > 0 else logged[-1]
    return steps, float(tokens)


def paired_rounds(args, model_path: Path, deadline: float = float("inf")) -> dict:
    """``args.rounds`` rounds of every variant (fewer if ``deadline``, a ``time.perf_counter()`` value, passes first;
    at least one), each variant's median step time, tokens per second and paired ratio to ``sync`` with its 95%
    bootstrap interval (the module docstring), printed as a table and returned."""
    rng = random.Random(args.seed)
    times = {variant: [] for variant in VARIANTS}
    medians = {variant: [] for variant in VARIANTS}
    token_rates = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as root:
        for round_index in range(args.rounds):
            if round_index > 0 and time.perf_counter() > deadline:
                break
            order = VARIANTS[round_index % 3:] + VARIANTS[:round_index % 3]
            for variant in order:
                steps, tokens = run_once(variant, args, model_path, Path(root) / f"{variant}-{round_index}")
                times[variant] += steps
                medians[variant].append(statistics.median(steps))
                token_rates[variant].append(tokens / sum(steps))
                print(f"round {round_index} {variant}: {statistics.median(steps):.3f} s/step", flush=True)
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "load_average": load_average(), "variants": {}}
    print("\n| variant | median s/step | tokens/s | paired ratio to sync [95% CI] |\n|---|---|---|---|")
    for variant in VARIANTS:
        ratios = [ours / base for ours, base in zip(medians[variant], medians["sync"])]
        low, high = bootstrap_interval(lambda index: statistics.median(ratios[i] for i in index), len(ratios), 2000,
                                       rng)
        median = statistics.median(times[variant])
        rate = statistics.median(token_rates[variant])
        results["variants"][variant] = {"median_step_seconds": median, "tokens_per_second": rate,
                                        "paired_ratio": statistics.median(ratios), "interval": [low, high]}
        print(f"| {variant} | {median:.3f} | {rate:.0f} | {statistics.median(ratios):.3f} [{low:.3f}, {high:.3f}] |")
    results["rounds"] = len(medians["sync"])
    return results


@contextlib.contextmanager
def vllm_server(model_path: Path, timeout: float = 600.0):
    """``sharpgrpo vllm-serve`` on ``model_path`` (float32, a free local port) for the ``with`` block: its URL."""
    import os
    import signal
    import socket
    import subprocess
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tempfile.NamedTemporaryFile(prefix="vllm_server_", suffix=".log", delete=False)
    server = subprocess.Popen([sys.executable, "-m", "sharpgrpo", "vllm-serve", "--model", str(model_path), "--host",
                               "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max_model_len", "512"],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the vLLM server did not start; its log: {log.name}")
            time.sleep(2)
        print(f"vLLM server on {model_path} at {url} (log {log.name})", flush=True)
        yield url
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model is not None:
        from sharpgrpo.models.prepared import resolve_model_name

        model_path = Path(resolve_model_name(args.model))
    else:
        model_path = build_model(args)  # built once into --model_dir (or a folder per size), then reused
    with contextlib.ExitStack() as stack:
        if args.vllm_server == "start":
            args.vllm_server = stack.enter_context(vllm_server(model_path))
        results = paired_rounds(args, model_path)
    if args.output is not None:
        args.output.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
