"""``search_format`` follows Search-R1's format check (``is_valid_sequence`` in ``verl/utils/reward_score/
qa_em_format.py``, commit a14dc3a, lines 49-121) on the response.

``PROBES`` states, for each response, what upstream's ``is_valid_sequence("<|im_start|>assistant\\n" + response)``
returns (worked out with those lines: balanced tag counts, then the state machine start -> think -> search ->
information -> think ... -> answer -> end, only whitespace between blocks); a fuzz test compares the state machine
with an independent grammar of the same language on random tag/text sequences."""

import random
import re

import pytest

from reward_fns import get_reward_function
from reward_fns.format import is_search_r1_sequence, search_format_score
from sharpgrpo.search.format import INVALID_ACTION_MESSAGE

INFO = "\n\n<information>Doc 1(Title: \"P\") x</information>\n\n"
PROBES = [
    ("<think> a </think>\n<answer> Paris </answer>", True),
    ("<think> a </think>\n<search> q </search>" + INFO + "<think> b </think>\n<answer> Paris </answer>\n", True),
    ("<think> a </think><search> q </search><information>x</information><answer> P </answer>", False),
    ("<answer> Paris </answer>", False),
    ("<think> a </think><answer> P </answer> more", False),
    ("<think> a </think><search> q </search>", False),
    ("", False),
    ("<think> 3 < 4 </think><answer> yes </answer>", True),  # a `<` inside a block
    ("<think> a </think><answer> x <b> y </answer>", True),
    (("<think> a </think><search> q </search>\n\n<information>Doc 1(Title: T) a <i>b</i> c</information>\n\n"
      "<think> b </think><answer> c </answer>"), True),  # markup inside retrieved text
    (("<think> a </think><search> q </search>\n\n<information>Doc 1 <think>x</think></information>\n\n"
      "<think> b </think><answer> c </answer>"), False),  # one of the four tags inside retrieved text
    ("<think> a </think><search> x<y </search>" + INFO + "<think> b </think><answer> c </answer>", True),
    ("<think> a <= b </think><answer> <3 </answer>", True),
    ("  \n<think> a </think>  <answer> c </answer>  \n", True),
    ("text<think> a </think><answer> c </answer>", False),
    ("<think> a </think>text<answer> c </answer>", False),
    ("<think> a </think><answer> c </answer><answer> d </answer>", False),
    ("<think> a <think> b </think></think><answer> c </answer>", False),
    ("<think> a </think><search> q </search>" + INFO + "<search> q2 </search>" + INFO
     + "<think> b </think><answer> c </answer>", False),  # a search right after information
    ("<think> a </think>" + INVALID_ACTION_MESSAGE + "<answer> c </answer>", False),  # the retry message's tags
    ("<Think> a </Think><answer> c </answer>", False),
]
BLOCK = r"(?:(?!</?(?:think|search|information|answer)>).)*"
GRAMMAR = re.compile(  # the same language written as one regular expression
    rf"\s*<think>{BLOCK}</think>\s*(?:<search>{BLOCK}</search>\s*<information>{BLOCK}</information>\s*"
    rf"<think>{BLOCK}</think>\s*)*<answer>{BLOCK}</answer>\s*",
    re.DOTALL,
)


@pytest.mark.parametrize("response,valid", PROBES)
def test_probes_agree_with_search_r1(response, valid):
    assert is_search_r1_sequence(response) is valid
    reward = get_reward_function("search_format")
    assert reward(prompts=["p"], completions=[response]) == [search_format_score(response)]
    assert (search_format_score(response) == 1.0) is valid


def test_state_machine_equals_the_grammar_on_random_sequences():
    pieces = ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>",
              "</answer>", " ", "\n", "x", "a < b", "<b>", "</i>", "<thinking>"]
    valid_shapes = ["<think>{}</think>{}<answer>{}</answer>",
                    ("<think>{}</think><search>{}</search>{}<information>{}</information><think>{}</think>"
                     "<answer>{}</answer>")]
    rng = random.Random(0)
    seen_valid = 0
    for trial in range(20000):
        if trial % 2:
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        else:  # a valid shape, then a few random edits
            shape = rng.choice(valid_shapes)
            text = shape.format(*(rng.choice(["", " ", "\n", "x", "a < b", "<b>"]) for _ in range(shape.count("{}"))))
            for _ in range(rng.randint(0, 2)):
                at = rng.randint(0, len(text))
                text = text[:at] + rng.choice(pieces) + text[at:]
        expected = GRAMMAR.fullmatch(text) is not None
        assert is_search_r1_sequence(text) is expected, text
        seen_valid += expected
    assert 1000 < seen_valid < 19000  # both answers occur often


def test_partial_credit_for_a_closed_answer_at_the_end():
    assert search_format_score("<answer> 3 < 4 </answer>\n") == 0.5
    assert search_format_score("blah </answer>") == 0.0
    assert search_format_score("<think> a </think><answer> b </answer> more") == 0.0
