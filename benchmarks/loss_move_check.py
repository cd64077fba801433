"""Behaviour check for refactorings of the loss and the strategy plumbing: the same seeds must give the same numbers.

Trains ``sharpgrpo-tiny`` on the CPU for two optimizer steps (seed 0, one thread) once per case: every registered
strategy alone, the TRL loss types with a weight strategy, the options that take other branches of the loss (KL,
off-policy steps, the top-entropy mask, the entropy bonus, the sharpness probe, token telemetry) and a few
compositions. Each case records, as exact float reprs: the loss of every ``compute_loss`` call, the logged metrics
of every step, the completion table's advantages, a digest of the trained parameters, and per telemetry column its
count and sum. Run it before a change and after, and compare the two files bit for bit:

    python benchmarks/loss_move_check.py --out before.json
    python benchmarks/loss_move_check.py --out after.json --compare before.json

``--compare`` prints every value that differs (telemetry columns are matched by their values when a column was
renamed) and exits 1 when anything does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BASE = {
    "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 8, "learning_rate": 1e-3,
    "logging_steps": 1, "save_strategy": "no", "seed": 0, "max_steps": 2, "report_to": [], "use_cpu": True,
    "bf16": False, "disable_tqdm": True,
}
# Options that take other branches of the loss.
KL = {"beta": 0.04}
OFF_POLICY = {"num_iterations": 2}  # TRL computes old log-probabilities: ratios away from 1, the clip acts


def cases(strategy_names: list[str], kinds: dict[str, str]) -> dict[str, dict]:
    """Case name -> config overrides."""
    found: dict[str, dict] = {}
    for name in strategy_names:
        options = {"strategies": [name]}
        if name == "gmpo":
            options["loss_type"] = "grpo"
        found[name] = options
        if kinds[name] == "loss" or name in ("grpo_sg", "ar"):
            found[f"{name}+kl+off_policy"] = {**options, **KL, **OFF_POLICY}
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"):
        found[f"grpo_sg/{loss_type}"] = {"strategies": ["grpo_sg"], "loss_type": loss_type, **KL, **OFF_POLICY}
    found["grpo_sg/ratio/sequence"] = {"strategies": ["grpo_sg"], "weight_placement": "ratio",
                                       "importance_sampling_level": "sequence", **OFF_POLICY}
    found["grpo_sg/ratio/inside"] = {"strategies": ["grpo_sg"], "weight_placement": "ratio",
                                     "kl_weighting": "inside", **KL, **OFF_POLICY}
    found["equal/entropy_mask/entropy_bonus"] = {"strategies": ["equal"], "top_entropy_quantile": 0.5,
                                                 "entropy_coef": 0.05, **KL}
    found["equal/off_policy_mask/delta"] = {"strategies": ["equal"], "off_policy_mask_threshold": 0.05,
                                            "delta": 1.2, **OFF_POLICY}
    for loss_type in ("dapo", "grpo"):  # two micro-batches a step: the window normaliser, accumulation
        found[f"grpo_sg/{loss_type}/accumulation"] = {"strategies": ["grpo_sg"], "loss_type": loss_type,
                                                      "gradient_accumulation_steps": 2, **KL}
    found["equal/adaptive_entropy"] = {"strategies": ["equal"], "use_adaptive_entropy": True, "entropy_coef": 0.1,
                                       "entropy_coef_delta": 0.05, "entropy_target": 100.0,
                                       "gradient_accumulation_steps": 2}
    found["random/sharpness_probe"] = {"strategies": ["random"], "sharpness_probe_steps": 1}
    found["grpo_sg/telemetry"] = {"strategies": ["grpo_sg"], "token_telemetry": True, **KL, **OFF_POLICY}
    found["archer+clip_cov/telemetry"] = {"strategies": ["archer", "clip_cov"], "token_telemetry": True, **KL,
                                          **OFF_POLICY}
    found["grpo_sg+thr+ar/telemetry"] = {"strategies": ["grpo_sg", "thr", "ar"], "token_telemetry": True}
    found["grpo_sg+cw_grpo"] = {"strategies": ["grpo_sg", "cw_grpo"]}
    found["grpo_sg+passk_mixed+thr"] = {"strategies": ["grpo_sg", "passk_mixed", "thr"]}
    found["gtpo+kl_cov+clip_cov"] = {"strategies": ["gtpo", "kl_cov", "clip_cov"], **OFF_POLICY}
    found["entropy_shaping+dppo_tv/sharpness"] = {"strategies": ["entropy_shaping", "dppo_tv"],
                                                 "sharpness_probe_steps": 1, **OFF_POLICY}
    return found


def exact(value):
    """A float's exact repr (JSON floats are exact already; NaN and inf as strings)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def binary_letters_reward(prompts, completions, allowed, **kwargs):
    """The demo reward thresholded at 0.5: groups with correct and incorrect completions (tests/helpers.py)."""
    from sharpgrpo.data.demo import allowed_letters_reward

    return [float(r >= 0.5) for r in allowed_letters_reward(prompts, completions, allowed)]


def run_case(options: dict, output_dir: Path) -> dict:
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
    from sharpgrpo.data.demo import demo_dataset
    from sharpgrpo.models.prepared import resolve_model_name

    losses: list[float] = []

    class Recording(SharpGRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(loss.detach().item())
            return loss

    torch.manual_seed(0)
    model = resolve_model_name("sharpgrpo-tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = SharpGRPOConfig(output_dir=str(output_dir), **{**BASE, **options})
        trainer = Recording(model=model, reward_funcs=[binary_letters_reward], args=args,
                            train_dataset=demo_dataset(32), processing_class=AutoTokenizer.from_pretrained(model))
        trainer.train()
    skip = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos")
    logs = [{k: exact(v) for k, v in entry.items() if k not in skip} for entry in trainer.state.log_history]
    digest = hashlib.sha256()
    for name, parameter in sorted(trainer.model.named_parameters()):
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().numpy().tobytes())
    telemetry = {}
    for path in sorted((output_dir / "telemetry").glob("*.parquet")):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        for column in table.column_names:
            values = table.column(column).to_numpy(zero_copy_only=False)
            if values.dtype.kind in "fiub":
                telemetry[f"{path.stem}:{column}"] = [int(np.count_nonzero(~np.isnan(values.astype(np.float64)))),
                                                      exact(float(np.nansum(values.astype(np.float64))))]
    return {
        "losses": [exact(v) for v in losses],
        "logs": logs,
        "advantages": [exact(float(v)) for v in trainer._logs["advantages"]],
        "parameters": digest.hexdigest(),
        "telemetry": telemetry,
    }


def compare(before: dict, after: dict) -> list[str]:
    problems = []
    for case in sorted(set(before) | set(after)):
        if case not in before or case not in after:
            problems.append(f"{case}: only in {'after' if case in after else 'before'}")
            continue
        b, a = before[case], after[case]
        if "error" in b or "error" in a:
            if b.get("error") != a.get("error"):
                problems.append(f"{case}: error before {b.get('error')!r}, after {a.get('error')!r}")
            continue
        for key in ("losses", "logs", "advantages", "parameters"):
            if b[key] != a[key]:
                problems.append(f"{case}: {key} differ:\n  before {b[key]}\n  after  {a[key]}")
        for column, value in b["telemetry"].items():
            if a["telemetry"].get(column) == value:
                continue
            stem, _, name = column.partition(":")  # a column renamed within its file: "<strategy>/<name>"
            renamed = [c for c, v in a["telemetry"].items() if c.startswith(f"{stem}:") and c.endswith(f"/{name}")
                       and v == value]
            if renamed:
                print(f"{case}: telemetry {column} is now {', '.join(renamed)} (same count and sum)")
            else:
                problems.append(f"{case}: telemetry {column} {value} has no equal column after "
                                f"({a['telemetry'].get(column)})")
        for column in sorted(set(a["telemetry"]) - set(b["telemetry"])):
            stem, _, name = column.partition(":")
            if f"{stem}:{name.rpartition('/')[2]}" not in b["telemetry"]:
                print(f"{case}: new telemetry column {column}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file written with every case's numbers")
    parser.add_argument("--compare", help="an earlier --out file: report every difference, exit 1 on any")
    parser.add_argument("--only", nargs="*", help="run only these cases")
    args = parser.parse_args(argv)
    import torch
    from tqdm import tqdm

    torch.set_num_threads(1)  # the same reduction order however busy the machine is
    from sharpgrpo.strategies import STRATEGIES

    names = STRATEGIES.names()
    selected = cases(names, {n: STRATEGIES.get(n).kind for n in names})
    if args.only:
        selected = {k: v for k, v in selected.items() if k in args.only}
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for case, options in tqdm(selected.items(), desc="cases"):
            try:
                results[case] = {"options": options, **run_case(options, Path(folder) / case.replace("/", "_"))}
            except Exception as error:  # noqa: BLE001 - recorded: the same error before and after is no change
                results[case] = {"options": options, "error": f"{type(error).__name__}: {error}"}
    Path(args.out).write_text(json.dumps(results, indent=1), encoding="utf-8")
    if args.compare:
        before = json.loads(Path(args.compare).read_text(encoding="utf-8"))
        if args.only:
            before = {k: v for k, v in before.items() if k in results}
        problems = compare(before, results)
        for problem in problems:
            print(problem)
        print(f"{len(results)} cases: {'identical' if not problems else f'{len(problems)} differences'}")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
