"""Binary math-verify reward (docs/methods.md §5): gold shapes, box extraction, thread safety and timeouts."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_fns.math import (
    MathVerifier,
    last_boxed_content,
    math_correct,
    math_reward,
    normalize_math_gold,
)


def reward(completion, answer):
    return math_reward(prompts=["p"], completions=[completion], answer=[answer])[0]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("so \\boxed{25}", "025", 1.0),  # AIME zero-padded string
        ("\\boxed{26}", "025", 0.0),
        ("\\boxed{142}", 142.0, 1.0),  # AMC float
        ("\\boxed{142.5}", 142.0, 0.0),
        ("\\boxed{9.6}", ["9.6\n"], 1.0),  # Minerva list with a trailing newline
        ("\\boxed{4.4 \\times 10^7}", ["4.4e7\n"], 1.0),  # Minerva sci-notation gold
        ("\\boxed{3.89 \\times 10^{-10}}", ["3.89e-10\n"], 1.0),
        ("\\boxed{\\frac{1}{2n+2}}", ["$\\frac{1}{2 n+2}$"], 1.0),  # OlympiadBench $...$
        ("\\boxed{84, 69}", ["$69$,$84$"], 1.0),  # OlympiadBench multi-answer gold
        ("\\boxed{84}", ["$69$,$84$"], 0.0),
        ("\\boxed{221, 8}", ["$221,$8$"], 1.0),
        ("\\boxed{0.5}", "\\frac12", 1.0),  # raw malformed LaTeX gold
        ("\\boxed{\\frac13}", "1/3", 1.0),  # malformed LaTeX prediction is repaired
        ("\\boxed{\\frac{14}{3}}", "\\frac{14}{3}", 1.0),
        ("\\boxed{10080}", "10,\\!080", 1.0),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("\\boxed{7}", ["6", "7"], 1.0),  # any acceptable gold
        ("\\boxed{5}", "\\boxed{5}", 1.0),  # a boxed gold is unwrapped
        ("\\boxed 5", "5", 1.0),
        ("\\fbox{5}", "5", 1.0),
    ],
)
def test_gold_shapes_and_equivalence(completion, answer, expected):
    assert reward(completion, answer) == expected


@pytest.mark.parametrize(
    "completion",
    ["the answer is 25", "$25$", "\\boxed{}", "\\boxed{  }", "\\boxed{25", "\\boxedx{25}", "", "\\boxed"],
)
def test_no_complete_box_scores_zero(completion):
    assert reward(completion, "25") == 0.0


def test_only_the_last_box_counts():
    completion = "first \\boxed{1}, finally \\boxed{2}"
    assert reward(completion, "2") == 1.0
    assert reward(completion, "1") == 0.0
    assert last_boxed_content("\\boxed{\\frac{1}{\\sqrt{2}}} and \\boxed{a{b}c}") == "a{b}c"


def test_chat_completions_and_missing_gold():
    completions = [[{"role": "assistant", "content": "\\boxed{4}"}], "\\boxed{4}"]
    assert math_reward(["p", "p"], completions, answer=["4", None]) == [1.0, None]


@pytest.mark.parametrize(
    ("gold", "expected"),
    [
        ("025", ["25"]),
        (142.0, ["142"]),
        (0.5, ["0.5"]),
        (["9.6\n", "9.6"], ["9.6"]),
        ("$\\frac{1}{2 n+2}$", ["\\frac{1}{2 n+2}"]),
        ("$69$,$84$", ["69, 84"]),
        ("$221,$8$", ["221,8"]),  # a broken OlympiadBench gold
        ("4.4e7", ["4.4 \\times 10^{7}"]),
        ("3.3e-010", ["3.3 \\times 10^{-10}"]),
        ("-007", ["-7"]),
        ("-0.0", ["0"]),
        ("\\boxed{5}", ["5"]),
        ("\\[x+1\\]", ["x+1"]),
        ([["1"], ("2", None)], ["1", "2"]),
        (None, []),
        ("", []),
    ],
)
def test_normalize_math_gold(gold, expected):
    assert normalize_math_gold(gold) == expected
    assert normalize_math_gold(expected) == expected  # idempotent: loaders' golds can be fed back


def test_huge_numbers_do_not_raise():
    """Python refuses int() on more than 4300 digits; normalisation must not depend on it."""
    digits = "0" * 3 + "7" * 5000
    assert normalize_math_gold(digits) == ["7" * 5000]
    assert normalize_math_gold(f"1e{'0' * 5000}1") == ["1 \\times 10^{1}"]
    assert reward(f"\\boxed{{{digits}}}", "7") == 0.0
    assert reward("\\boxed{-0.0}", "0") == 1.0


def test_math_verify_alone_cannot_time_out_off_the_main_thread():
    """The failure this module works around: math-verify's signal timeout raises in a worker thread."""
    from math_verify import parse

    errors = []

    def run():
        try:
            parse("$\\frac{1}{2}$", parsing_timeout=5, raise_on_error=True)
        except ValueError as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors and "thread" in str(errors[0])


def test_reward_works_from_other_threads():
    results = []
    thread = threading.Thread(target=lambda: results.append(reward("\\boxed{\\frac13}", "\\frac{1}{3}")))
    thread.start()
    thread.join()
    assert results == [1.0]
    golds = [str(i) for i in range(8)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        rewards = list(pool.map(lambda i: reward(f"\\boxed{{{i % 4}}}", golds[i]), range(8)))
    assert rewards == [1.0] * 4 + [0.0] * 4


def test_math_verify_timeouts_work_inside_the_worker():
    """Called from a non-main thread, math-verify's own 1 s timeouts still fire (in the worker's main thread)."""
    verifier = MathVerifier(parsing_timeout=1, verify_timeout=1, watchdog_seconds=60.0)
    try:
        result = []
        start = time.monotonic()
        slow = threading.Thread(
            target=lambda: result.append(verifier.equivalent("\\boxed{9^{9^{9}}}", ["\\boxed{1}"]))
        )
        slow.start()
        slow.join()
        assert result == [False] and verifier.restarts == 0
        assert time.monotonic() - start < 30.0
        assert verifier.equivalent("\\boxed{1}", ["\\boxed{1}"])
    finally:
        verifier.close()


def test_watchdog_kills_a_hung_worker_and_recovers():
    """9^(9^9) keeps sympy busy for seconds; the caller gives up after the watchdog and the next call restarts."""
    verifier = MathVerifier(parsing_timeout=5, verify_timeout=5, watchdog_seconds=60.0)
    try:
        assert verifier.equivalent("\\boxed{2}", ["\\boxed{2}"])  # worker started and warmed up
        verifier.watchdog_seconds = 0.5
        start = time.monotonic()
        result = []
        hung = threading.Thread(
            target=lambda: result.append(verifier.equivalent("\\boxed{9^{9^{9}}}", ["\\boxed{1}"]))
        )
        hung.start()
        hung.join()
        assert result == [False]
        assert time.monotonic() - start < 4.0  # well before the worker's own 5 s alarm
        verifier.watchdog_seconds = 60.0
        assert verifier.equivalent("\\boxed{3}", ["\\boxed{3}"])
        assert verifier.restarts == 1
        assert math_correct("\\boxed{3}", "3", verifier=verifier)
    finally:
        verifier.close()


FRAGMENTS = st.sampled_from(
    ["\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "$", "\\frac", "12", "^", "\\", "\\left(", "\\right)", "=", ",",
     "\\text{", "\ud800", "\x00", "\n", "x", "\\infty", "\\sqrt{"]
)  # fmt: skip
ADVERSARIAL_TEXT = st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=20).map("".join)
ANY_GOLD = st.one_of(
    ADVERSARIAL_TEXT,
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.lists(ADVERSARIAL_TEXT, max_size=3),
    st.none(),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    completion=st.one_of(
        ADVERSARIAL_TEXT, st.lists(st.fixed_dictionaries({"content": ADVERSARIAL_TEXT}), max_size=2), st.integers()
    ),
    gold=ANY_GOLD,
)
def test_never_raises_on_any_text(completion, gold):
    rewards = math_reward(prompts=["p"], completions=[completion], answer=[gold])
    assert len(rewards) == 1
    assert rewards[0] in ({None} if gold is None else {0.0, 1.0})


@settings(max_examples=40, deadline=None)
@given(value=st.integers(min_value=-(10**6), max_value=10**6))
def test_any_integer_matches_its_padded_and_float_golds(value):
    padded = f"-{abs(value):05d}" if value < 0 else f"{value:05d}"
    assert reward(f"\\boxed{{{value}}}", padded) == 1.0
    assert reward(f"\\boxed{{{value}}}", float(value)) == 1.0
    assert reward(f"\\boxed{{{value + 1}}}", float(value)) == 0.0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=st.text(max_size=30).filter(lambda s: "{" not in s and "}" not in s and s.strip()), gold=ANY_GOLD)
def test_any_box_content_reaches_math_verify_without_raising(content, gold):
    assert last_boxed_content(f"x \\boxed{{{content}}} y") == content
    assert math_reward(prompts=None, completions=[f"\\boxed{{{content}}}"], answer=[gold])[0] in {None, 0.0, 1.0}
