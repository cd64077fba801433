"""Logic-RL K&K reward (docs/methods.md §5, GRPO-SG Table 5) and the lenient evaluation check."""

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_fns._common import last_tagged_block
from reward_fns.kk import first_role_after_name, kk_correct, kk_reward, kk_score, parse_gold

GOLD = "(1) Zoey is a knight\n(2) Oliver is a knave"
PREFILLED = "<|im_start|>user\nquiz\n<|im_end|>\n<|im_start|>assistant\n<think>"  # Logic-RL's prompt ending
RIGHT = "(1) Zoey is a knight\n(2) Oliver is a knave"
WRONG = "(1) Zoey is a knave\n(2) Oliver is a knave"


def score(completion, gold=GOLD, prompt=PREFILLED):
    return kk_reward(prompts=[prompt], completions=[completion], solution_text_format=[gold])[0]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (f" Zoey is honest. </think>\n<answer> {RIGHT} </answer>", 3.0),
        (f" reasoning </think><answer>{WRONG}</answer>", -0.5),
        # Parses but incomplete: count check fails (one role for two people) -> unparseable.
        (" reasoning </think><answer>(1) Zoey is a knight</answer>", -1.0),
        # "knights" counts as a "knight" occurrence, so the count check fails although both names parse.
        (f" r </think><answer>{RIGHT}\nBoth knights checked.</answer>", -1.0),
        # Roles stated without "NAME is a ROLE" do not parse.
        (" r </think><answer>Zoey: knight, Oliver: knave</answer>", -1.0),
        (" r </think><answer>   </answer>", -1.0),  # empty answer
        (f" r </think><answer>{RIGHT}</answer> trailing text is allowed", 3.0),
        # Numbering and order are free, case is ignored.
        (" r </think><answer>oliver IS A KNAVE, and zoey is a Knight.</answer>", 3.0),
        # Format failures: the answer is not scored (-1 + -2), even when right.
        (f" r <answer>{RIGHT}</answer>", -3.0),  # no </think>
        (f"<think> r </think><answer>{RIGHT}</answer>", -3.0),  # a second <think> after the prefill
        (f" r </think><answer>{RIGHT}</answer><answer>{RIGHT}</answer>", -3.0),
        (f" r <answer>{RIGHT}</answer></think>", -3.0),  # wrong order
        ("", -3.0),
    ],
)
def test_logicrl_reward_table(completion, expected):
    assert score(completion) == expected


def test_totals_are_the_four_logicrl_values():
    completions = [
        f" r </think><answer>{RIGHT}</answer>",
        f" r </think><answer>{WRONG}</answer>",
        " r </think><answer>nothing</answer>",
        "no tags at all",
    ]
    rewards = kk_reward([PREFILLED] * 4, completions, solution_text_format=[GOLD] * 4)
    assert rewards == [3.0, -0.5, -1.0, -3.0]


def test_word_boundaries_keep_names_apart():
    gold = "(1) Ella is a knave\n(2) Isabella is a knight"
    # "Isabella is a knight" must not be read as Ella's role; Ella's own statement is found instead.
    right = " r </think><answer>(1) Isabella is a knight\n(2) Ella is a knave</answer>"
    assert score(right, gold) == 3.0
    # Without Ella's own statement the answer does not parse (Isabella's line does not count for Ella).
    missing = " r </think><answer>(1) Isabella is a knight\n(2) Someone is a knave</answer>"
    assert score(missing, gold) == -1.0


def test_prefill_rule_depends_on_the_prompt():
    full = f"<think> r </think><answer>{RIGHT}</answer>"
    # Without an opened <think> in the prompt the completion is scored as is and must open it itself.
    assert score(full, prompt="plain prompt") == 3.0
    assert score(full[len("<think>") :], prompt="plain prompt") == -3.0
    # Trailing whitespace after the prefill still counts as an opened <think>.
    assert score(full[len("<think>") :], prompt=PREFILLED + "\n") == 3.0
    # Conversational prompts: an assistant message ending in <think> is continued by TRL, a user message is not.
    system_user = [{"role": "system", "content": "s"}, {"role": "user", "content": "quiz"}]
    prefill = system_user + [{"role": "assistant", "content": "<think>"}]
    assert score(full[len("<think>") :], prompt=prefill) == 3.0
    assert score(full, prompt=system_user) == 3.0
    assert score(full[len("<think>") :], prompt=system_user) == -3.0


def test_chat_message_completions():
    completion = [{"role": "assistant", "content": f" r </think><answer>{RIGHT}</answer>"}]
    assert score(completion) == 3.0


def test_missing_gold_is_not_applicable():
    rewards = kk_reward([PREFILLED] * 2, [" r </think><answer>x</answer>"] * 2, solution_text_format=[GOLD, None])
    assert rewards[0] == -1.0 and rewards[1] is None


def test_parse_gold_reads_logicrl_solution_lines():
    assert parse_gold(GOLD) == {"Zoey": "knight", "Oliver": "knave"}
    assert parse_gold(None) == {}


def test_kk_score_matches_the_trl_wrapper():
    text = f"<think> r </think><answer>{RIGHT}</answer>"
    assert kk_score(text, GOLD) == score(text[len("<think>") :]) == 3.0


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (f"r </think><answer>{RIGHT}</answer>", True),  # no <think> needed
        (f"r </think><answer>{WRONG}</answer>", False),
        # Lenient: no count check, first match within a line per name.
        ("r </think><answer>Zoey is a knight (I checked all knights). Oliver: a knave</answer>", True),
        (f"r <answer>{RIGHT}</answer>", False),  # no </think>
        (f"r </think></think><answer>{RIGHT}</answer>", False),
        (f"r </think><answer>{RIGHT}</answer><answer>{RIGHT}</answer>", False),
        (f"<answer>{RIGHT}</answer></think>", False),
        ("r </think><answer>(1) Zoey is a knight</answer>", False),  # Oliver missing
        # The role must follow the name on the same line.
        ("r </think><answer>Zoey\nis a knight, Oliver is a knave</answer>", False),
    ],
)
def test_kk_correct(completion, expected):
    assert kk_correct(completion, GOLD) is expected


def test_kk_correct_accepts_messages_and_rejects_missing_gold():
    assert kk_correct([{"role": "assistant", "content": f"</think><answer>{RIGHT}</answer>"}], GOLD)
    assert not kk_correct(f"</think><answer>{RIGHT}</answer>", None)


FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "Zoey", "Oliver", " is a ", "knight", "knave", "KNAVE",
     "(1) ", "\n", " ", "\\b", "(", "*", "İ", "\x00", "\ud800", "Ella", "Isabella"]
)  # fmt: skip
ADVERSARIAL_TEXT = st.lists(st.one_of(FRAGMENTS, st.text(max_size=20)), max_size=30).map("".join)
ANY_COMPLETION = st.one_of(
    ADVERSARIAL_TEXT,
    st.lists(st.fixed_dictionaries({"role": st.just("assistant"), "content": ADVERSARIAL_TEXT}), max_size=2),
    st.none(),
    st.integers(),
    st.lists(st.one_of(st.none(), st.integers(), st.dictionaries(st.text(max_size=3), st.integers())), max_size=2),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.one_of(ADVERSARIAL_TEXT, st.just(PREFILLED), st.none()), completion=ANY_COMPLETION,
       gold=st.one_of(st.just(GOLD), ADVERSARIAL_TEXT))  # fmt: skip
def test_never_raises_and_stays_in_the_reward_set(prompt, completion, gold):
    rewards = kk_reward(prompts=[prompt], completions=[completion], solution_text_format=[gold])
    assert len(rewards) == 1 and rewards[0] in {3.0, -0.5, -1.0, -3.0}
    assert kk_correct(completion, gold) in (True, False)


TAG_FREE = st.text(max_size=40).filter(lambda s: "<think>" not in s and "</think>" not in s and "answer>" not in s)


@settings(max_examples=200, deadline=None)
@given(thinking=TAG_FREE, tail=TAG_FREE)
def test_any_reasoning_text_keeps_a_right_answer_right(thinking, tail):
    completion = f"{thinking}</think><answer>{RIGHT}</answer>{tail}"
    assert score(completion) == 3.0
    assert kk_correct(completion, GOLD)


SMALL_TEXT = st.lists(
    st.sampled_from(
        ["<answer>", "</answer>", "<answer", "answer>", "Zoey", "zoey", " is a ", "knight", "knave", "\n", "x"]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=SMALL_TEXT)
def test_linear_extractors_agree_with_the_reference_regexes(text):
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert last_tagged_block(text, "<answer>", "</answer>") == (matches[-1] if matches else None)
    match = re.search(r"\bZoey\b.*?\b(knight|knave)\b", text, re.IGNORECASE)
    assert first_role_after_name(text, "Zoey") == (match.group(1).lower() if match else None)


def test_degenerate_outputs_are_scored_in_linear_time():
    """Repetition loops must not stall training: the reference regexes take tens of seconds on these."""
    start = time.monotonic()
    assert score("<answer>" * 20000) == -3.0
    assert score(" r </think><answer>" + "Zoey " * 20000 + "</answer>") == -1.0
    assert not kk_correct("</think><answer>" + "Zoey " * 20000 + "</answer>", GOLD)
    assert time.monotonic() - start < 5.0
