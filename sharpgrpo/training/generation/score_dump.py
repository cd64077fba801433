"""Per-token scores of an advantage strategy (THR's influence scores) written out for inspection
(``dump_token_scores``): one JSON line per completion with its decoded tokens, scores and token advantages."""

from __future__ import annotations

import json
import os

import torch


def dump_token_scores(folder: str, generation_index: int, global_step: int, batch, scores: torch.Tensor,
                      token_advantages: torch.Tensor, decode) -> str:
    """Write ``folder/generation_{index:06d}.jsonl`` for the completions of ``batch`` (a ``GenerationBatch``);
    ``decode(token_id)`` gives a token's text. Returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"generation_{generation_index:06d}.jsonl")
    scores, advantages = scores.float().cpu(), token_advantages.float().cpu()
    masks, completion_ids = batch.completion_mask.bool().cpu(), batch.completion_ids.cpu()
    group_ids, rewards = batch.group_ids.tolist(), batch.rewards.tolist()
    with open(path, "w", encoding="utf-8") as file:
        for row, valid in enumerate(masks):
            record = {
                "global_step": global_step,
                "group_id": group_ids[row],
                "reward": rewards[row],
                "tokens": [decode([i]) for i in completion_ids[row][valid].tolist()],
                "scores": scores[row][valid].tolist(),
                "advantages": advantages[row][valid].tolist(),
            }
            file.write(json.dumps(record) + "\n")
    return path
