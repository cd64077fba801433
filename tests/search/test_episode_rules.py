"""The episode rules of Search-R1 (commit a14dc3a, ``search_r1/llm_agent/generation.py``), turn by turn.

Search-R1 generates a whole response, cuts it after the first ``</search>``, else after the first ``</answer>``
(``_postprocess_responses``, lines 54-75), takes the first ``<(search|answer)>(.*?)</\\1>`` match as the action
(``postprocess_predictions``, lines 407-436), and for a response without one appends, masked, "My previous action is
invalid. ... Let me try again." and gives the model another turn (``execute_predictions``, lines 395-401); the turn
counts against ``max_turns``, after which one last response is generated without search (``run_llm_loop``, lines
234-300).

Each row of ``TURNS`` is a model's text for one turn, what Search-R1 does with it (worked out with the lines above),
and, where we deliberately differ, what we do and why. ``{eos}`` is the end-of-sequence token, which Search-R1 drops
when it decodes with ``skip_special_tokens=True``.
"""

import pytest

from sharpgrpo.models.tiny import build_tokenizer
from sharpgrpo.search.format import INVALID_ACTION_MESSAGE, format_passages, information_block
from sharpgrpo.search.rollout import SearchLimits, run_episodes

STOP_AT_ANSWER = (
    "we stop generating at the first </answer> as well as at </search> (stop_at_answer), so the text after it that "
    "Search-R1 generates and then cuts at a later </search> never exists here"
)
# (turn text, max_turn_tokens, Search-R1's action, its content, our action and content where we differ, why)
TURNS = [
    ("<search>capital of france</search>", 200, "search", "capital of france", None, ""),
    ("<think>x</think><search> q </search>", 200, "search", "q", None, ""),
    ("  \n<search>q</search>", 200, "search", "q", None, ""),
    ("<search>q1</search><search>q2</search>", 200, "search", "q1", None, ""),
    ("<search>q</search><answer>x</answer>", 200, "search", "q", None, ""),
    ("<search> a <search> b</search>", 200, "search", "a <search> b", None, ""),
    ("<search></search>", 200, "search", "", None, ""),
    ("<information>fake</information><search>q</search>", 200, "search", "q", None, ""),
    ("<think>" + "long reasoning " * 8 + "</think><search>q</search>", 200, "search", "q", None, ""),
    ("<answer>Paris</answer>", 200, "answer", "Paris", None, ""),
    ("<think>a</think>\n<answer> Paris </answer>{eos}", 200, "answer", "Paris", None, ""),
    ("<answer>a</answer> extra text{eos}", 200, "answer", "a", None, ""),
    ("<answer>\nmulti\nline\n</answer>", 200, "answer", "multi\nline", None, ""),
    ("<answer>a <b> c</answer>", 200, "answer", "a <b> c", None, ""),
    ("<answer></answer>", 200, "answer", "", None, ""),
    ("<answer>x</answer><search>q</search>", 200, "answer", "x", None, ""),  # same action; we keep less text
    ("<information>fake</information><answer>x</answer>", 200, "answer", "x", None, ""),
    ("<think>I know</think>{eos}", 200, None, "", None, ""),
    ("{eos}", 200, None, "", None, ""),
    ("<search>unclosed query{eos}", 200, None, "", None, ""),
    ("<answer>x{eos}", 200, None, "", None, ""),
    ("just </search>", 200, None, "", None, ""),
    ("<answer>x</search>", 200, None, "", None, ""),
    ("</answer>", 200, None, "", None, ""),
    ("<Answer>x</Answer>{eos}", 200, None, "", None, ""),
    ("<search>q</search>", 12, None, "", None, ""),  # cut inside the closing tag by the turn's token limit
    ("<think>no tags, runs out of tokens", 16, None, "", None, ""),
    ("<search>q</answer> more</search>", 200, "search", "q</answer> more", (None, ""), STOP_AT_ANSWER),
    ("<search>who <answer>x</answer> is</search>", 200, "search", "who <answer>x</answer> is", ("answer", "x"),
     STOP_AT_ANSWER),
]
NEXT_TURN = "<answer>done</answer>"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


class TurnBackend:
    """Plays ``turns[k]`` in the k-th generation call of a row (k = blocks the environment appended so far), past
    any stop string as a model without stop strings would, cut to ``max_tokens``."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate(self, rows, max_tokens, stop):
        self.calls += 1
        out = []
        for row in rows:
            text = self.tokenizer.decode(row)
            k = text.count("<information>Doc") + text.count("Let me try again.")
            text = self.turns[min(k, len(self.turns) - 1)].replace("{eos}", self.tokenizer.eos_token)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
            out.append((ids, [-0.25] * len(ids)))
        return out


def retrieve(queries):
    return [[{"document": {"id": "1", "contents": f'"T"\nabout {q}'}}] for q in queries]


def play(tokenizer, turns, max_turn_tokens=200, **limits):
    prompt = tokenizer("Q:", add_special_tokens=False)["input_ids"]
    backend = TurnBackend(tokenizer, turns)
    limits = SearchLimits(**{"max_completion_length": 2000, "max_turn_tokens": max_turn_tokens, **limits})
    (episode,) = run_episodes([prompt], backend, retrieve, tokenizer, limits)
    return episode, backend


@pytest.mark.parametrize("text,max_turn_tokens,upstream,content,ours,why", TURNS)
def test_turn_follows_search_r1(tokenizer, text, max_turn_tokens, upstream, content, ours, why):
    expected = (upstream, content) if ours is None else ours
    episode, _ = play(tokenizer, [text, NEXT_TURN], max_turn_tokens=max_turn_tokens, max_search_turns=2)
    completion = tokenizer.decode(episode.completion_ids, skip_special_tokens=True)
    if expected[0] == "search":
        assert episode.queries == [expected[1]] and episode.invalid == 0
        assert information_block(format_passages(retrieve([expected[1]])[0])) in completion
    elif expected[0] == "answer":
        assert episode.end_reason in ("answer", "eos") and episode.turns == 1 and episode.searches == 0
        from sharpgrpo.search.format import parse_action

        assert parse_action(completion) == ("answer", expected[1])
    else:  # invalid: the message, then the next turn
        assert episode.invalid == 1 and episode.searches == 0 and episode.turns == 2
        assert INVALID_ACTION_MESSAGE in completion and completion.endswith(NEXT_TURN)
    assert len(TURNS) >= 25


def test_retry_message_is_masked_and_a_sampled_eos_is_dropped(tokenizer):
    episode, _ = play(tokenizer, ["<think>hm</think>{eos}", NEXT_TURN])
    turn1 = tokenizer("<think>hm</think>", add_special_tokens=False)["input_ids"]
    message = tokenizer(INVALID_ACTION_MESSAGE, add_special_tokens=False)["input_ids"]
    turn2 = tokenizer(NEXT_TURN, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    assert episode.completion_ids == turn1 + message + turn2 + [eos]
    assert episode.env_mask == [1] * len(turn1) + [0] * len(message) + [1] * len(turn2) + [0]
    assert episode.env_roles == [0] * len(turn1) + [2] * len(message) + [0] * len(turn2) + [0]  # the retry: user
    assert episode.logprobs == [-0.25] * len(turn1) + [0.0] * len(message) + [-0.25] * len(turn2) + [0.0]
    assert episode.completion_ids.count(eos) == 1  # TRL would mask everything after a first EOS


def test_invalid_turns_count_and_the_last_turn_gets_no_retry(tokenizer):
    """max_turns = 2: two turns that may retry or search, then one last turn (Search-R1's final rollout)."""
    episode, backend = play(tokenizer, ["<think>hm</think>{eos}"], max_search_turns=2)
    assert backend.calls == 3 and episode.turns == 3 and episode.invalid == 2 and episode.end_reason == "eos"
    episode, backend = play(tokenizer, ["<think>hm</think>{eos}", "<search>q</search>"], max_search_turns=2)
    assert backend.calls == 3 and episode.invalid == 1 and episode.searches == 1 and episode.end_reason == "turn_cap"


def test_invalid_action_end_stops_at_the_first_invalid_turn(tokenizer):
    episode, backend = play(tokenizer, ["<think>hm</think>{eos}", NEXT_TURN], invalid_action="end")
    assert backend.calls == 1 and episode.end_reason == "eos" and episode.invalid == 0
    with pytest.raises(ValueError, match="invalid_action must be one of"):
        SearchLimits(max_completion_length=10, invalid_action="again")


def test_search_arguments_refuse_an_unknown_invalid_action():
    from sharpgrpo.search.config import SearchArguments
    from sharpgrpo.validation import ConfigError

    assert SearchArguments().invalid_action == "retry"
    with pytest.raises(ConfigError, match="invalid_action"):
        SearchArguments(invalid_action="skip")
