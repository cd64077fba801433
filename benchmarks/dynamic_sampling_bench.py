"""Dynamic sampling against plain GRPO: reward per generated sample and per second (benchmarks/CLAIMS.md §6).

For each seed, ``python train.py --config configs/strict_letters_cpu.yaml`` with and without ``dynamic_sampling``
(the same steps, the same seed), then ``sharpgrpo eval --task strict_letters`` on all 56 letter subsets (greedy
accuracy). Per run: the sampled training reward of the last quarter of the steps (TRL's ``reward``, the mean over
every completion generated in a step, refill rounds included), the completions generated (every round's, from
``dynamic_sampling/groups_generated``; steps x batch without it), the training wall time, the final greedy
accuracy, and the gain over the untrained model's accuracy per 1000 generated completions and per minute. Prints a
markdown table of means with 95% t-intervals over seeds and the paired differences; writes the numbers as JSON
(``--json``).

    OMP_NUM_THREADS=1 nice python benchmarks/dynamic_sampling_bench.py --seeds 0 1 2 --max-steps 30 \
        --json benchmarks/claims/dynamic_sampling/equal_steps.json
    OMP_NUM_THREADS=1 nice python benchmarks/dynamic_sampling_bench.py --seeds 0 1 2 --only plain \
        --plain-max-steps 75 --json benchmarks/claims/dynamic_sampling/plain_equal_completions.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/strict_letters_cpu.yaml"
BATCH = 32  # the config's per_device_train_batch_size (completions per step)
NUM_GENERATIONS = 8


def run(command: list[str], timeout: int = 3600) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")


def greedy_accuracy(model: str, output: Path) -> float:
    """``sharpgrpo eval --task strict_letters``: the greedy accuracy on all 56 letter subsets."""
    result_file = output / "result.json"
    run([sys.executable, "-m", "sharpgrpo", "eval", "--model", model, "--task", "strict_letters",
         "--output", str(result_file), "--n_samples", "1", "--max_new_tokens", "8", "--no_progress"])
    return float(json.loads(result_file.read_text())["summary"]["groups"]["greedy"]["accuracy"])


def train_one(seed: int, dynamic: bool, max_steps: int, folder: Path) -> dict:
    out = folder / f"{'dynamic' if dynamic else 'plain'}_{seed}"
    command = [sys.executable, "train.py", "--config", CONFIG, "--seed", str(seed), "--output_dir", str(out),
               "--max_steps", str(max_steps)]
    if dynamic:
        command += ["--dynamic_sampling", "true"]
    start = time.perf_counter()
    run(command)
    seconds = time.perf_counter() - start
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [entry for entry in history if "reward" in entry and "loss" in entry]
    generated = sum(entry.get("dynamic_sampling/groups_generated", BATCH / NUM_GENERATIONS) for entry in steps)
    last = steps[-max(1, len(steps) // 4):]  # TRL's `reward`: the mean over every completion generated that step
    return {"seed": seed, "dynamic": dynamic, "steps": len(steps), "completions": generated * NUM_GENERATIONS,
            "seconds": seconds, "final_reward": sum(entry["reward"] for entry in last) / len(last),
            "accuracy": greedy_accuracy(str(out), folder / f"eval_{out.name}")}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--plain-max-steps", type=int, default=None,
                        help="Steps of the runs without dynamic sampling (default --max-steps); e.g. as many as give "
                        "the dynamic runs' number of generated completions.")
    parser.add_argument("--only", choices=("plain", "dynamic"), default=None, help="Run one of the two.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from sharpgrpo.compare.stats import mean_interval

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        start_accuracy = greedy_accuracy("sharpgrpo-tiny", folder / "eval_start")
        modes = [m for m in (False, True) if args.only is None or args.only == ("dynamic" if m else "plain")]
        runs = [train_one(seed, dynamic, args.max_steps if dynamic else (args.plain_max_steps or args.max_steps),
                          folder) for seed in args.seeds for dynamic in modes]
    for r in runs:
        gain = r["accuracy"] - start_accuracy
        r["gain_per_1000_completions"] = 1000 * gain / r["completions"]
        r["gain_per_minute"] = 60 * gain / r["seconds"]
    metrics = ("final_reward", "accuracy", "completions", "seconds", "gain_per_1000_completions", "gain_per_minute")
    rows = ["| | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    summary = {}
    for dynamic in modes:
        mine = [r for r in runs if r["dynamic"] == dynamic]
        cells = {m: mean_interval([r[m] for r in mine]) for m in metrics}
        summary["dynamic" if dynamic else "plain"] = cells
        rows.append(f"| {'dynamic_sampling' if dynamic else 'plain'} | " + " | ".join(
            f"{c['mean']:.4g} [{c['low']:.4g}, {c['high']:.4g}]" for c in cells.values()) + " |")
    differences = {}
    if len(modes) == 2:
        differences = {m: mean_interval([d[m] - p[m] for p, d in zip(
            [r for r in runs if not r["dynamic"]], [r for r in runs if r["dynamic"]], strict=True)]) for m in metrics}
        rows.append("| paired difference | " + " | ".join(
            f"{c['mean']:.4g} [{c['low']:.4g}, {c['high']:.4g}]" for c in differences.values()) + " |")
    print(f"untrained greedy accuracy {start_accuracy:.4f}; steps: dynamic {args.max_steps}, plain "
          f"{args.plain_max_steps or args.max_steps}; seeds {args.seeds}")
    print("\n".join(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"start_accuracy": start_accuracy, "runs": runs, "summary": summary,
                                         "paired_difference": differences}, indent=1))


if __name__ == "__main__":
    main()
