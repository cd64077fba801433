"""A tiny offline model for the search setting: ``sharpgrpo-tiny`` plus single tokens for Search-R1's tags, warm-started
on synthetic Search-R1 episodes (prompt, ``<think>``, ``<search>``, retrieved ``<information>``, ``<answer>``).

It is cached apart from ``sharpgrpo-tiny`` (``$SHARPGRPO_CACHE/tiny-search-qwen2-v{TINY_SEARCH_VERSION}``) and
resolved from the name ``sharpgrpo-tiny-search``. The warm start teaches the format only (the loss skips the prompt
and the retrieved text, as RL does); whether the answer is right is left to RL. It trains on the full Search-R1 prompt
as RL and Search-R1 feed it, one user message rendered with the chat template. It stays weak: about 10% of the demo's RL
episodes start with a search (~6% for an earlier build on the prompt's last line only), and 600 warm-start steps
instead of 200 did not give well-formed first turns either (0 of 16 sampled). About 30 s of CPU time on 2 idle cores.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

from sharpgrpo.models.prepared import register_prepared_model
from sharpgrpo.search.format import INFO_CLOSE, INFO_OPEN, SEARCH_CLOSE, SEARCH_OPEN, information_block, make_prompt

TINY_SEARCH_NAME = "sharpgrpo-tiny-search"
TINY_SEARCH_VERSION = 3  # bump when the build changes
SEARCH_TAG_TOKENS = [SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE]
_WORDS = ["river", "city", "king", "queen", "film", "song", "author", "river", "painter", "island", "bridge", "tower", "battle", "novel", "league", "team", "mountain", "lake", "empire", "church", "school", "castle", "opera", "poet", "village", "prize", "museum", "valley", "harbour", "temple", "forest", "desert"]
_NAMES = ["Alder", "Brisa", "Corvin", "Dalia", "Elbrus", "Fenna", "Galen", "Hesper", "Ilona", "Jorun", "Kasimir", "Liesel", "Marek", "Nerys", "Odile", "Piran"]


def search_episode(rng: random.Random) -> tuple[str, str, str, str]:
    """(question's Search-R1 prompt, first turn, information block, last turn) of one synthetic episode."""
    subject = f"{rng.choice(_NAMES)} {rng.choice(_WORDS)}"
    relation = rng.choice(["founded", "wrote", "built", "won", "named"])
    answer = rng.choice(_NAMES)
    question = f"Who {relation} the {subject}"
    passages = "\n".join(
        [f'Doc 1(Title: "{subject}") The {subject} was {relation} by {answer}.']
        + [f'Doc {i}(Title: "{rng.choice(_NAMES)} {rng.choice(_WORDS)}") A {rng.choice(_WORDS)} in {rng.choice(_NAMES)}.'
           for i in (2, 3)]
    )
    first = f"<think> Search it. </think>\n{SEARCH_OPEN} {question} {SEARCH_CLOSE}"
    last = f"<think> Doc 1 says {answer}. </think>\n<answer> {answer} </answer>"
    return make_prompt(question), first, information_block(passages), last


def build_search_tokenizer():
    from sharpgrpo.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.add_tokens(SEARCH_TAG_TOKENS)
    return tokenizer


def build_tiny_search_model(directory: str | os.PathLike, warm_start_steps: int = 200, seed: int = 0,
                            overwrite: bool = False, batch_size: int = 8, lr: float = 5e-3) -> Path:
    """Build (or reuse) the tiny search model in ``directory``; see the module docstring."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    directory = Path(directory)
    if (directory / "config.json").exists() and not overwrite:
        return directory
    torch.manual_seed(seed)
    tokenizer = build_search_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    from tqdm.auto import tqdm

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this tiny model is ~2x faster on one thread than on two busy cores
    try:
        _warm_start(model, tokenizer, optimizer, rng, warm_start_steps, batch_size, tqdm)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    from sharpgrpo.models.tiny import save_built_model

    return save_built_model(model, tokenizer, directory)


def _warm_start(model, tokenizer, optimizer, rng, warm_start_steps, batch_size, tqdm) -> None:
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    for _ in tqdm(range(warm_start_steps), desc="warm start (tiny search model)", disable=warm_start_steps < 50):
        rows, labels = [], []
        for _ in range(batch_size):
            prompt, first, info, last = search_episode(rng)
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                   add_generation_prompt=True)
            parts = [(encode(prompt), False), (encode(first), True), (encode(info), False),
                     (encode(last) + [tokenizer.eos_token_id], True)]
            ids = [t for p, _ in parts for t in p]
            rows.append(ids)
            labels.append([t if trained else -100 for p, trained in parts for t in p])
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        label_ids = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@register_prepared_model(TINY_SEARCH_NAME)
def prepare_tiny_search_model(cache_dir: Path) -> Path:
    return build_tiny_search_model(cache_dir / f"tiny-search-qwen2-v{TINY_SEARCH_VERSION}")
