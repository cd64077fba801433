"""The Search-R1 rollout (``sharpgrpo.search.rollout``) with SmolLM2's BPE tokenizer and a local BM25 server.

With this vocabulary ``</search>`` is several tokens and merges with its neighbours (`` </``, ``>.``, ``>",``): the stop
is found across tokens, the merged token is kept as sampled, and ``env_mask`` is 0 exactly on the appended
``\\n\\n<information>...</information>\\n\\n`` span."""

import json

import pytest

pytest.importorskip("fastapi", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("uvicorn", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("bm25s", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")

from sharpgrpo.search.client import RetrievalClient  # noqa: E402
from sharpgrpo.search.format import format_passages, information_block  # noqa: E402
from sharpgrpo.search.rollout import HFGenerateBackend, SearchLimits, run_episodes  # noqa: E402
from sharpgrpo.search.server import RetrievalServerProcess  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

CORPUS = [
    '"Paris"\nParis is the capital and largest city of France.',
    '"Berlin"\nBerlin is the capital of Germany.',
    '"Danube"\nThe Danube flows through Vienna and Budapest.',
]


@pytest.fixture(scope="module")
def retrieve(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(CORPUS)))
    with RetrievalServerProcess(str(path), start_timeout=60) as url:
        client = RetrievalClient(url + "/retrieve", timeout=10)
        yield lambda queries: client.retrieve(queries, topk=1)


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class ReplayBackend:
    """Returns, per turn, the tokenizer's own BPE ids of a scripted text: what a sampler emits when it picks the
    vocabulary's merged tokens, including text past the stop inside the same token (vLLM and transformers return the
    whole token that completes a stop string)."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate(self, rows, max_tokens, stop):
        ids = encode(self.tokenizer, self.turns[self.calls])[:max_tokens]
        self.calls += 1
        return [(ids, [-0.25] * len(ids)) for _ in rows]


def information_span(mask):
    zeros = [i for i, m in enumerate(mask) if m == 0]
    return zeros[0], zeros[-1] + 1


@pytest.mark.parametrize("closing", [" </search>.", '</search>",'])
def test_merged_search_close_and_information_mask(smol_tokenizer, retrieve, closing):
    tokenizer = smol_tokenizer
    turn1 = "<think>I should look it up.</think>\n<search> capital of France" + closing
    turn2 = "<answer> Paris </answer>"
    pieces = [tokenizer.decode([i]) for i in encode(tokenizer, turn1)]
    assert "</search>" not in pieces and pieces[-1] in (">.", '>",')  # the stop ends inside a merged token
    prompt = encode(tokenizer, tokenizer.apply_chat_template([{"role": "user", "content": "Capital of France?"}],
                                                             add_generation_prompt=True, tokenize=False))
    (episode,) = run_episodes([prompt], ReplayBackend(tokenizer, [turn1, turn2]), retrieve, tokenizer,
                              SearchLimits(max_completion_length=300))  # fmt: skip
    assert episode.queries == ["capital of France"] and episode.end_reason == "answer"
    start, end = information_span(episode.env_mask[:-1])  # the last 0 is the <|im_end|> the environment appends
    info = encode(tokenizer, information_block(format_passages(retrieve(["capital of France"])[0])))
    assert episode.completion_ids[:start] == encode(tokenizer, turn1)  # sampled ids kept, merged token included
    assert episode.completion_ids[start:end] == info
    assert set(episode.env_mask[start:end]) == {0} and set(episode.env_mask[:start]) == {1}
    assert tokenizer.decode(info).startswith("\n\n<information>Doc 1(Title: \"Paris\") Paris is the capital")
    assert tokenizer.decode(info).endswith("</information>\n\n")
    assert episode.completion_ids[end:-1] == encode(tokenizer, turn2) and set(episode.env_mask[end:-1]) == {1}
    assert episode.completion_ids[-1] == tokenizer.eos_token_id and episode.env_mask[-1] == 0
    assert episode.logprobs[start:end] == [0.0] * (end - start)


def test_real_model_rollout_stops_at_search_and_masks_the_information(smol_path, smol_tokenizer, retrieve):
    """SmolLM2 itself, greedy, writes the search it was asked to repeat; the rollout stops at </search> (here inside
    the merged token ``>.``), retrieves, and masks the passage."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = smol_tokenizer
    model = AutoModelForCausalLM.from_pretrained(smol_path, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Repeat exactly: <search>capital of France</search>."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    config = GenerationConfig(do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    backend = HFGenerateBackend(model, tokenizer, config)
    limits = SearchLimits(max_completion_length=80, max_search_turns=1, max_turn_tokens=20)
    (episode,) = run_episodes([encode(tokenizer, prompt)], backend, retrieve, tokenizer, limits)
    assert episode.searches == 1 and episode.queries == ["capital of France"]
    start, end = information_span(episode.env_mask)
    sampled = [tokenizer.decode([i]) for i in episode.completion_ids[:start]]
    assert "".join(sampled).endswith("</search>.") and sampled[-1] == ">."
    info_text = tokenizer.decode(episode.completion_ids[start:end])
    assert info_text == information_block(episode.retrieved[0]) and "Paris" in info_text
    assert set(episode.env_mask[:start]) == {1} and set(episode.env_mask[end:]) <= {1}
