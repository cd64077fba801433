"""The sampler-trainer gap on a mixture of experts, with and without routing replay (benchmarks/RESULTS.md).

    python benchmarks/routing_gap.py [--dtype bfloat16] [--prompts 16] [--generations 4] [--tokens 32] [--seeds 0 1 2]

The sampler is transformers' ``generate`` (KV-cache decoding); the trainer is one full forward over prompt +
completion, as TRL's loss runs it. Both are the same weights of ``sharpgrpo-tiny-moe``, cast to ``--dtype``. For every
completion token this reports, over all tokens of all seeds: the routing agreement (the fraction of MoE layers whose
full-forward top-k set is the one generate used), and the gap |log p_sampler - log p_trainer| of the sampled token
with the trainer's forward routed live (replay off) and with generate's routes replayed
(``sharpgrpo.training.generation.routing_replay``). The sampler's log-probabilities are read from the decoding steps
(``sharpgrpo.training.generation.capture.GenerationCapture``, temperature 1, before any logits processor).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def rollout_gaps(model, tokenizer, prompts: list[str], generations: int, tokens: int, seed: int) -> dict:
    from trl.trainer.utils import pad

    from sharpgrpo.training.generation.capture import GenerationCapture
    from sharpgrpo.training.generation.routing_replay import AGREEMENT_KEY, RoutingReplay

    replay = RoutingReplay([model])
    try:
        encoded = [torch.tensor(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                                              add_generation_prompt=True, return_dict=False))
                   for p in prompts for _ in range(generations)]
        ids = pad(encoded, padding_value=tokenizer.pad_token_id, padding_side="left")
        mask = pad([torch.ones_like(e) for e in encoded], padding_value=0, padding_side="left")
        torch.manual_seed(seed)
        with replay.generation(), GenerationCapture(model, 1.0, logps=True) as capture, torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=tokenizer.pad_token_id)
        completion = out[:, ids.shape[1]:]
        sampled = capture.result(completion.tolist())["logps"]
        batch = {"prompt_ids": ids, "prompt_mask": mask, "completion_ids": completion,
                 "completion_mask": torch.ones_like(completion)}
        batch = replay.attach(batch)
        full_ids = torch.cat([ids, completion], dim=1)
        full_mask = torch.cat([mask, batch["completion_mask"]], dim=1)

        def trainer_logps():
            logits = model(input_ids=full_ids, attention_mask=full_mask).logits[:, ids.shape[1] - 1:-1].float()
            return logits.log_softmax(-1).gather(-1, completion[..., None]).squeeze(-1)

        with torch.no_grad():
            round_routes, replay.round = replay.round, None  # else a forward of the round's tokens replays them
            live = trainer_logps()
            replay.round = round_routes
            with replay.loss_batch(batch):
                replayed = trainer_logps()
        agreement = batch[AGREEMENT_KEY][:, :-1]  # the last sampled token has no route
        return {"agreement": agreement.flatten(), "gap_off": (sampled - live)[:, :-1].abs().flatten(),
                "gap_on": (sampled - replayed)[:, :-1].abs().flatten()}
    finally:
        replay.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharpgrpo.data.demo import demo_dataset
    from sharpgrpo.models.prepared import resolve_model_name

    path = resolve_model_name("sharpgrpo-tiny-moe")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = demo_dataset(args.prompts)
    prompts = [row["prompt"][-1]["content"] if isinstance(row["prompt"], list) else row["prompt"] for row in rows]
    parts = [rollout_gaps(model, tokenizer, prompts, args.generations, args.tokens, seed) for seed in args.seeds]
    merged = {key: torch.cat([p[key] for p in parts]).double() for key in parts[0]}
    summary = {
        "dtype": args.dtype, "tokens": int(merged["agreement"].numel()),
        "routing_agreement": float(merged["agreement"].mean()),
        "tokens_with_a_differing_layer": float((merged["agreement"] < 1).double().mean()),
        "mean_abs_gap_replay_off": float(merged["gap_off"].mean()),
        "mean_abs_gap_replay_on": float(merged["gap_on"].mean()),
        "max_abs_gap_replay_off": float(merged["gap_off"].max()),
        "max_abs_gap_replay_on": float(merged["gap_on"].max()),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
