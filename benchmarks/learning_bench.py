"""Does every registered strategy, with its defaults, learn on the demo task? (README "Decisions").

For each strategy and seed: ``python train.py --config configs/demo.yaml --strategies NAME --seed S`` (the demo's
200 steps unless ``--max-steps``), then the mean reward of the first and of the last 10% of the logged steps. A
strategy learns on a seed when the last 10% is above the first 10%. Prints a markdown table and writes the numbers
as JSON (``--json``). ``tests/integration/test_learning.py`` runs it as a slow, opt-in test.

    OMP_NUM_THREADS=1 nice python benchmarks/learning_bench.py --json outputs/learning.json
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
DEFAULT_STRATEGIES = ("grpo_sg", "equal", "random", "reverse", "ar", "cw_grpo", "thr", "nthr", "passk_mixed",
                      "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "gmpo",
                      "entropy_shaping", "gtpo", "ktae", "archer",
                      "otb", "tir_otb")
# What a strategy needs beyond the demo config: GMPO its own aggregation (`loss_type: grpo`); KL-Cov and DPPO act only
# off-policy (docs/methods.md §10.1), so they train with two updates per generation batch.
STRATEGY_OPTIONS = {
    "gmpo": ["--loss_type", "grpo"],
    "kl_cov": ["--num_iterations", "2"],
    "dppo_tv": ["--num_iterations", "2"],
    "dppo_kl": ["--num_iterations", "2"],
}


def first_last_reward(trainer_state: dict, fraction: float = 0.1) -> tuple[float, float, int]:
    """(mean reward of the first ``fraction`` of logged steps, of the last ``fraction``, number of steps)."""
    rewards = [entry["reward"] for entry in trainer_state["log_history"] if "reward" in entry and "loss" in entry]
    if not rewards:
        raise ValueError("no logged step has a reward")
    count = max(1, round(fraction * len(rewards)))
    return sum(rewards[:count]) / count, sum(rewards[-count:]) / count, len(rewards)


def run_one(strategy: str, seed: int, output_dir: Path, max_steps: int | None = None, timeout: int = 1800) -> dict:
    """Train the demo with one strategy and seed; return its first/last-10% rewards and wall time."""
    command = [sys.executable, "train.py", "--config", "configs/demo.yaml", "--strategies", strategy,
               "--seed", str(seed), "--output_dir", str(output_dir), *STRATEGY_OPTIONS.get(strategy, [])]
    if max_steps is not None:
        command += ["--max_steps", str(max_steps)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{strategy} seed {seed} failed:\n{result.stderr[-3000:]}")
    state = json.loads((output_dir / "trainer_state.json").read_text())
    first, last, steps = first_last_reward(state)
    return {"strategy": strategy, "seed": seed, "first": first, "last": last, "steps": steps,
            "wall_s": time.perf_counter() - start}


def run_all(strategies=DEFAULT_STRATEGIES, seeds=(0, 1, 2), max_steps: int | None = None, workdir=None,
            progress: bool = True) -> list[dict]:
    from tqdm.auto import tqdm

    runs = [(s, seed) for s in strategies for seed in seeds]
    results = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for strategy, seed in tqdm(runs, desc="demo runs", disable=not progress):
            results.append(run_one(strategy, seed, Path(tmp) / f"{strategy}_{seed}", max_steps))
    return results


def markdown(results: list[dict]) -> str:
    seeds = sorted({r["seed"] for r in results})
    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    by_key = {(r["strategy"], r["seed"]): r for r in results}
    header = "| strategy | " + " | ".join(f"seed {s}: first -> last 10%" for s in seeds) + " | learns on all |"
    lines = [header, "|---|" + "---|" * (len(seeds) + 1)]
    for strategy in strategies:
        cells, learns = [], True
        for seed in seeds:
            r = by_key[(strategy, seed)]
            cells.append(f"{r['first']:.3f} -> {r['last']:.3f}")
            learns &= r["last"] > r["first"]
        lines.append(f"| `{strategy}` | " + " | ".join(cells) + f" | {'yes' if learns else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=list(DEFAULT_STRATEGIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=None, help="override the demo's 200 steps")
    parser.add_argument("--json", type=Path, default=None, help="write the per-run numbers here")
    args = parser.parse_args()
    results = run_all(args.strategies, args.seeds, args.max_steps)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    print(markdown(results))


if __name__ == "__main__":
    main()
