"""Multi-turn rollout with a scripted generator: env_mask on exactly the injected span, the turn cap, the completion
budget, stop strings split across tokens, episodes without </search>, and equal generation calls across processes."""

import threading

import pytest

from sharpgrpo.models.tiny import build_tokenizer
from sharpgrpo.search.format import format_passages, information_block
from sharpgrpo.search.rollout import SearchLimits, first_stop, run_episodes

DOCS = {
    "capital of france": [{"document": {"id": "1", "contents": '"France"\nParis is the capital of France.'}}],
    "eiffel": [{"document": {"id": "2", "contents": '"Eiffel Tower"\nThe tower is in Paris.'}}],
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def retrieve(queries):
    return [DOCS.get(q, [{"document": {"id": "0", "contents": '"None"\nnothing'}}]) for q in queries]


class ScriptedBackend:
    """Plays a scripted text per turn; the turn is the number of <information> blocks already in the row. Like a
    real backend it returns at most ``max_tokens`` ids, and may run past a stop string (``overrun`` extra text)."""

    def __init__(self, tokenizer, scripts, overrun=""):
        self.tokenizer, self.scripts, self.overrun = tokenizer, scripts, overrun
        self.calls = []

    def generate(self, rows, max_tokens, stop):
        self.calls.append((len(rows), max_tokens, tuple(stop)))
        out = []
        for row in rows:
            text = self.tokenizer.decode(row)
            script = next(s for p, s in self.scripts.items() if text.startswith(p))
            turn = text.count("<information>")
            piece = script[min(turn, len(script) - 1)] + self.overrun
            ids = self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            out.append((ids[:max_tokens], [-0.5] * min(len(ids), max_tokens)))
        return out


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run(tokenizer, scripts, overrun="", **limits):
    prompts = [encode(tokenizer, p) for p in scripts]
    backend = ScriptedBackend(tokenizer, scripts, overrun)
    limits = SearchLimits(**{"max_completion_length": 400, **limits})
    return run_episodes(prompts, backend, retrieve, tokenizer, limits), backend


def test_env_mask_is_zero_exactly_on_the_information_block(tokenizer):
    turn1 = "<think>need it</think><search>capital of france</search>"
    turn2 = "<answer>Paris</answer>"
    (episode,), backend = run(tokenizer, {"Q: capital?": [turn1, turn2]})
    info = encode(tokenizer, information_block(format_passages(DOCS["capital of france"])))
    eos = tokenizer.eos_token_id
    assert episode.completion_ids == encode(tokenizer, turn1) + info + encode(tokenizer, turn2) + [eos]
    n1, n2 = len(encode(tokenizer, turn1)), len(encode(tokenizer, turn2))
    assert episode.env_mask == [1] * n1 + [0] * len(info) + [1] * n2 + [0]  # EOS appended by the environment
    assert episode.env_roles == [0] * n1 + [4] * len(info) + [0] * n2 + [0]  # passages: tool; the EOS: no message
    assert episode.logprobs == [-0.5] * n1 + [0.0] * len(info) + [-0.5] * n2 + [0.0]
    assert (episode.turns, episode.searches, episode.end_reason, episode.truncated) == (2, 1, "answer", False)
    assert episode.queries == ["capital of france"]
    assert tokenizer.decode(info) == "\n\n<information>Doc 1(Title: \"France\") Paris is the capital of France.</information>\n\n"
    assert backend.calls[0][2] == ("</search>", "</answer>")


def test_sampled_eos_is_trained_without_stop_at_answer(tokenizer):
    eos = tokenizer.eos_token
    (episode,), _ = run(tokenizer, {"Q:": ["<answer>x</answer>" + eos]}, stop_at_answer=False)
    assert episode.completion_ids[-1] == tokenizer.eos_token_id and episode.env_mask[-1] == 1
    assert episode.end_reason == "eos" and set(episode.env_mask) == {1}


def test_turn_cap(tokenizer):
    (episode,), backend = run(tokenizer, {"Q:": ["<search>eiffel</search>"]}, max_search_turns=2)
    assert episode.searches == 2 and episode.turns == 3 and episode.end_reason == "turn_cap"
    assert len(backend.calls) == 3
    assert tokenizer.decode(episode.completion_ids).count("<information>") == 2
    assert not episode.truncated


def test_budget_truncates_observation_and_generation(tokenizer):
    turn = "<search>capital of france</search>"
    budget = len(encode(tokenizer, turn)) + 10
    (episode,), _ = run(tokenizer, {"Q:": [turn, "<answer>Paris</answer>"]}, max_completion_length=budget)
    assert len(episode.completion_ids) == budget and episode.truncated and episode.end_reason == "budget"
    assert episode.env_mask[-10:] == [0] * 10
    # A generation cut by the budget
    (episode,), _ = run(tokenizer, {"Q:": ["<think>" + "a" * 50]}, max_completion_length=20)
    assert len(episode.completion_ids) == 20 and episode.truncated and set(episode.env_mask) == {1}


def test_max_obs_tokens_keeps_the_closing_tag(tokenizer):
    (episode,), _ = run(tokenizer, {"Q:": ["<search>capital of france</search>", "<answer>Paris</answer>"]},
                        max_obs_tokens=60)
    obs = [t for t, m in zip(episode.completion_ids, episode.env_mask) if m == 0][:-1]  # without the final EOS
    assert len(obs) == 60
    text = tokenizer.decode(obs)
    assert text.startswith("\n\n<information>Doc 1(") and text.endswith("</information>\n\n")


def test_stop_string_split_across_tokens_is_cut_after_it(tokenizer):
    # The byte-level tokenizer spells </search> in 9 tokens; the backend runs past it (as transformers pads rows).
    turn = "<search>eiffel</search>"
    (episode,), _ = run(tokenizer, {"Q:": [turn, "<answer>Paris</answer>"]}, overrun=" and more text")
    first = episode.completion_ids[: len(encode(tokenizer, turn))]
    assert tokenizer.decode(first) == turn and episode.env_mask[len(first)] == 0
    assert episode.queries == ["eiffel"]
    ids = encode(tokenizer, "ab</sea") + encode(tokenizer, "rch>cd")
    assert first_stop(ids, tokenizer.decode, ["</search>"], []) == len(encode(tokenizer, "ab</search>"))
    assert first_stop(encode(tokenizer, "no stop here"), tokenizer.decode, ["</search>"], []) is None


def test_no_action_ends_the_episode_with_invalid_action_end(tokenizer):
    (episode,), backend = run(tokenizer, {"Q:": ["<think>I know</think>" + tokenizer.eos_token]}, invalid_action="end")
    assert episode.searches == 0 and episode.turns == 1 and episode.end_reason == "eos" and len(backend.calls) == 1
    (episode,), _ = run(tokenizer, {"Q:": ["x" * 40]}, max_turn_tokens=16, invalid_action="end")
    assert episode.end_reason == "turn_tokens" and episode.truncated and len(episode.completion_ids) == 16
    (episode,), _ = run(tokenizer, {"Q:": ["just </search>"]}, invalid_action="end")  # no query: no retrieval
    assert episode.end_reason == "invalid" and episode.searches == 0


def test_processes_make_equal_generation_calls(tokenizer):
    """Two processes in threads: one finishes after a turn, the other searches 3 times; sync_max is a real
    all-reduce(max) over a barrier. Both must issue the same calls with the same row counts and max_tokens."""
    barrier, values, lock = threading.Barrier(2), {}, threading.Lock()

    def make_sync(rank):
        def sync_max(value):
            with lock:
                values[rank] = value
            barrier.wait()
            result = max(values.values())
            barrier.wait()
            return result
        return sync_max

    scripts = [
        {"Q0:": ["<answer>a</answer>"], "Q1:": ["<answer>b</answer>"]},
        {"Q2:": ["<search>eiffel</search>"] * 3 + ["<answer>c</answer>"], "Q3:": ["<answer>d</answer>"]},
    ]
    backends = [ScriptedBackend(tokenizer, s) for s in scripts]
    results = [None, None]

    def worker(rank):
        prompts = [encode(tokenizer, p) for p in scripts[rank]]
        limits = SearchLimits(max_completion_length=300 + 100 * rank, max_search_turns=4)
        results[rank] = run_episodes(prompts, backends[rank], retrieve, tokenizer, limits, make_sync(rank))

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert backends[0].calls == backends[1].calls
    assert [c[0] for c in backends[0].calls] == [2, 1, 1, 1]  # rank 0 sends a dummy row for turns 2-4
    assert results[1][0].searches == 3 and results[0][0].searches == 0
