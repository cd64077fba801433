"""ECHO's world-model claim on the search setting: the environment tokens' cross-entropy on held-out rollouts.

ECHO (arXiv 2605.24517) reports that its policies predict the environment's tokens better "even on trajectories they
did not generate: across held-out rollouts, it sharply reduces environment-token cross-entropy while GRPO alone
barely changes it". This script measures that on the runs of a ``sharpgrpo compare`` of the search setting:

1. One fixed set of held-out episodes: the search setting's multi-turn rollout (``sharpgrpo.search.rollout``,
   the training limits of the config) of the *initial* model on the test split's questions, sampled at the config's
   temperature with a fixed seed, against a retrieval server started from the config's corpus. No trained model
   generated them and no run trained on them (the runs train on the train split).
2. For the initial model and every run's final model (``runs/<strategy>/seed<k>/``), one forward over these episodes:
   the mean -log p over the environment's tokens (``env_mask`` 0: retrieved passages, the retry message) and, as a
   control, over the model's own tokens (``env_mask`` 1).
3. Per strategy: the mean over seeds with its Student-t interval, and the paired difference against the first
   strategy on the same seed (``sharpgrpo.compare.stats``).

    python benchmarks/echo_world_model.py --config configs/search_demo.yaml --runs outputs/claims_53/echo \
        --output benchmarks/claims/echo_search [--questions 40] [--samples 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/search_demo.yaml")
    parser.add_argument("--runs", type=Path, required=True, help="a `sharpgrpo compare --output` folder")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=40, help="test-split questions")
    parser.add_argument("--samples", type=int, default=2, help="episodes per question")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def held_out_episodes(config: dict, args, workdir: Path):
    """The initial model's episodes on the test split (see the module docstring): (tokenizer, rows of
    (prompt_ids, completion_ids, env_mask))."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from sharpgrpo.models.prepared import resolve_model_name
    from sharpgrpo.search.config import SearchArguments
    from sharpgrpo.search.data import search_qa_rows
    from sharpgrpo.search.rollout import HFGenerateBackend, SearchLimits, run_episodes
    from sharpgrpo.search.session import retrieval_session

    path = resolve_model_name(config["model_name_or_path"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    fields = {f for f in SearchArguments.__dataclass_fields__}
    search_args = SearchArguments(**{k: v for k, v in config.items() if k in fields})
    limits = SearchLimits.from_args(search_args, config["max_completion_length"])
    rows = search_qa_rows("test")[: args.questions]
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        for r in rows for _ in range(args.samples)
    ]
    generation = GenerationConfig(do_sample=True, temperature=float(config.get("temperature", 1.0)), top_p=1.0,
                                  top_k=0, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                                  eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(args.seed)
    with retrieval_session(search_args, str(workdir)) as client:
        episodes = run_episodes(prompts, HFGenerateBackend(model, tokenizer, generation),
                                lambda queries: client.retrieve(queries, limits.retrieval_topk), tokenizer, limits)
    return tokenizer, [(list(p), e.completion_ids, e.env_mask) for p, e in zip(prompts, episodes)]


@torch.no_grad()
def token_nll(model_path: str, episodes) -> dict[str, float]:
    """Mean -log p over the episodes' environment tokens and over the model's own tokens (token-weighted)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    sums = {"env": 0.0, "own": 0.0}
    counts = {"env": 0, "own": 0}
    for prompt, completion, env_mask in episodes:
        if not completion:
            continue
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        mask = torch.tensor(env_mask, dtype=torch.bool)
        for name, selected in (("env", ~mask), ("own", mask)):
            sums[name] += float(-logps[selected].sum())
            counts[name] += int(selected.sum())
    return {f"{name}_nll": sums[name] / max(counts[name], 1) for name in sums} | {
        f"{name}_tokens": counts[name] for name in counts}


def run_models(runs: Path) -> dict[str, dict[int, Path]]:
    """``{strategy: {seed: final model folder}}`` of a compare folder, in the compare's order (summary.json)."""
    summary = json.loads((runs / "summary.json").read_text(encoding="utf-8"))
    order = [summary["baseline"], *summary["strategies"]]
    found: dict[str, dict[int, Path]] = {}
    for folder in sorted((runs / "runs").glob("*/seed*")):
        if (folder / "model.safetensors").exists():
            found.setdefault(folder.parent.name, {})[int(folder.name[4:])] = folder
    return {name: found[name] for name in order if name in found} | {
        name: seeds for name, seeds in found.items() if name not in order}


def main(argv=None) -> None:
    from sharpgrpo.compare.stats import mean_interval, paired_difference
    from sharpgrpo.run.config_file import read_config

    args = parse_args(argv)
    config = read_config(args.config)
    args.output.mkdir(parents=True, exist_ok=True)
    tokenizer, episodes = held_out_episodes(config, args, args.output)
    from sharpgrpo.models.prepared import resolve_model_name

    initial = token_nll(resolve_model_name(config["model_name_or_path"]), episodes)
    models = run_models(args.runs)
    scores = {name: {seed: token_nll(str(path), episodes) for seed, path in seeds.items()}
              for name, seeds in models.items()}
    baseline = next(iter(scores))
    table = {}
    for name, seeds in scores.items():
        table[name] = {key: mean_interval([s[key] for s in seeds.values()]) for key in ("env_nll", "own_nll")}
        if name != baseline:
            for key in ("env_nll", "own_nll"):
                table[name][f"{key}_minus_{baseline}"] = paired_difference(
                    {k: v[key] for k, v in seeds.items()}, {k: v[key] for k, v in scores[baseline].items()}, -1)
    result = {"command": " ".join(sys.argv), "episodes": len(episodes), "initial": initial, "per_run": {
        name: {str(k): v for k, v in seeds.items()} for name, seeds in scores.items()}, "per_strategy": table}
    (args.output / "world_model.json").write_text(json.dumps(result, indent=2), encoding="utf-8")

    def cell(stat):
        if stat["low"] is None:
            return f"{stat['mean']:.4f}"
        return f"{stat['mean']:.4f} [{stat['low']:.4f}, {stat['high']:.4f}]"

    lines = [f"Held-out episodes: {len(episodes)} ({initial['env_tokens']} environment tokens, {initial['own_tokens']} "
             f"own tokens); initial model: env NLL {initial['env_nll']:.4f}, own NLL {initial['own_nll']:.4f}.", "",
             "| strategy | seeds | env-token NLL | own-token NLL | env NLL minus " + baseline + " (wins) |",
             "|---|---|---|---|---|"]
    for name, row in table.items():
        diff = row.get(f"env_nll_minus_{baseline}")
        extra = "" if diff is None else f"{cell(diff)} ({diff['wins']}/{len(diff['seeds'])})"
        lines.append(f"| {name} | {row['env_nll']['n']} | {cell(row['env_nll'])} | {cell(row['own_nll'])} | {extra} |")
    (args.output / "world_model.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
