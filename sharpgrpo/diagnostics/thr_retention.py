"""THR's retained fraction with the default threshold on a model's own samples (docs/methods.md §3).

THR keeps the tokens with |THR| > tau (THR Eq. 5); its paper reports the retained fraction (App. E.5, Table 16: 18%
for Qwen2.5-Math-1.5B, 14% for 7B). :func:`thr_retention` measures it on G completions sampled from a causal LM,
with the positive set P = the first G/2 samples (samples are exchangeable, so this is a uniformly random split of
the group). Used by ``benchmarks/thr_retention.py`` and the tests.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def sample_group(model, tokenizer, prompt: str, length: int, group_size: int, seed: int):
    """(hidden (G, L, H), completion ids (G, L), sampled-token probabilities (G, L)) of G sampled completions."""
    torch.manual_seed(seed)
    encoded = tokenizer([prompt] * group_size, return_tensors="pt")
    output = model.generate(**encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_new_tokens=length,
                            max_new_tokens=length, pad_token_id=tokenizer.pad_token_id)
    completion = output[:, encoded["input_ids"].shape[1]:]
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=output).last_hidden_state[:, -length - 1:-1]
    logits = model.get_output_embeddings()(hidden).float()
    probs = torch.softmax(logits, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    return hidden.float(), completion, probs


def thr_retention(model, tokenizer, prompt: str, length: int, group_size: int = 8, seed: int = 0, beta: float = 1.0):
    """thr/frac_retained and tau of one sampled group (P = the first G/2 samples), plus the sampled probabilities."""
    from sharpgrpo.strategies.thr import thr_threshold, thr_token_advantages, token_hidden_reward_scores

    hidden, ids, probs = sample_group(model, tokenizer, prompt, length, group_size, seed)
    mask = torch.ones_like(ids)
    positive = torch.arange(group_size) < group_size // 2
    head = model.get_output_embeddings()
    scores = token_hidden_reward_scores(hidden, ids, mask, positive, head.weight, getattr(head, "bias", None)).scores
    tau = thr_threshold(scores, mask, positive, beta)
    advantages = torch.where(positive, 1.0, -1.0)
    _, metrics = thr_token_advantages(scores, tau, advantages, mask, positive)
    return metrics["thr/frac_retained"], tau, probs
