"""Every row is checked before the model loads (``sharpgrpo.data.row_checks`` via ``train.py``'s front end): a bad
prompt anywhere in the data, an empty reward column, a chat template that cannot render a row, and a prompt longer
than the model's context minus max_completion_length are refused naming the row (the line, for a .jsonl file)."""

from __future__ import annotations

import pytest
from helpers import write_jsonl
from transformers import AutoTokenizer

from sharpgrpo.data.checks import load_checked_dataset
from sharpgrpo.data.row_checks import check_prompt_lengths, check_rows, model_context_length, prompt_problem
from sharpgrpo.run.input_checks import check_rewards, resolve_reward_functions
from sharpgrpo.validation import ConfigError


@pytest.fixture(scope="module")
def tiny_model_path():
    """The prepared sharpgrpo-tiny folder (built once and cached, as train.py uses it)."""
    from sharpgrpo.models.prepared import resolve_model_name

    return resolve_model_name("sharpgrpo-tiny")


GOOD = {"prompt": "letters: abc. word:", "allowed": "abc"}


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"prompt": None}, "line 5: prompt is null"),
        ({"prompt": 7}, r"line 5: prompt is an int \(7\)"),
        ({"prompt": "   "}, "line 5: prompt is empty"),
        ({"prompt": []}, "line 5: prompt is an empty list of messages"),
        ({"prompt": [{"role": "user"}]}, r"line 5: prompt message 0 \(user\) has no content"),
        ({"prompt": [{"content": "hi"}]}, "line 5: prompt message 0 has no role"),
        ({"prompt": ["hi"]}, "line 5: prompt message 0 is a str"),
    ],
)
def test_a_bad_prompt_in_a_file_is_refused_naming_its_line(tmp_path, bad, fragment):
    path = write_jsonl(tmp_path / "data.jsonl", [GOOD] * 4 + [{**GOOD, **bad}] + [GOOD] * 4)
    with pytest.raises(ConfigError, match=fragment):
        load_checked_dataset(path, None)


def test_rows_built_by_the_loader_are_checked_too(tmp_path):
    """A prompt made by column_mapping is checked on the loaded rows (row numbers count from 1)."""
    rows = [{"question": "q?", "allowed": "a"}] * 3 + [{"question": None, "allowed": "a"}]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    dataset = load_checked_dataset(path, {"column_mapping": {"question": "prompt"}})
    names = ["allowed_letters"]
    with pytest.raises(ConfigError, match=r"row 4: prompt None is null"):
        check_rewards(names, resolve_reward_functions(names), dataset, path)


def test_a_reward_column_empty_in_every_row_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "2+2?", "answer": None}] * 3)
    dataset = load_checked_dataset(path, None)
    with pytest.raises(ConfigError, match="column 'answer', which reward function 'math' reads, is empty"):
        check_rewards(["math"], resolve_reward_functions(["math"]), dataset, path)
    check_rows(dataset, "d", {"think_format": ()})  # a reward that reads no column


def test_prompt_problem_accepts_what_trl_trains_on():
    assert prompt_problem("x") is None
    assert prompt_problem([{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]) is None
    assert prompt_problem([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) is None


def test_prompt_lengths_against_the_context(tiny_model_path):
    from datasets import Dataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    context = model_context_length(tiny_model_path)
    assert context == 4096
    fits = "a" * 100
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in (fits,)]
    budget = context - 10
    long_prompt = "b" * (budget + 1 - lengths[0] + 100)
    dataset = Dataset.from_dict({"prompt": [fits] * 1500 + [long_prompt]})
    with pytest.raises(ConfigError, match=rf"row 1501: the prompt has \d+ tokens; .* 4096 tokens minus "
                       rf"max_completion_length=10 leaves {budget}"):  # fmt: skip
        check_prompt_lengths(dataset, tokenizer, context, 10, "d")
    check_prompt_lengths(dataset.select(range(1500)), tokenizer, context, 10, "d")
    with pytest.raises(ConfigError, match="max_completion_length=4096: leaves no room"):
        check_prompt_lengths(dataset, tokenizer, context, 4096, "d")


def test_a_chat_template_that_fails_or_drops_a_message_names_the_row(tiny_model_path):
    from datasets import Dataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    user = {"role": "user", "content": "hello"}
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}U: {{ m['content'] }}\n"
        "{% elif m['role'] == 'bad' %}{{ raise_exception('unknown role') }}{% endif %}{% endfor %}A:"
    )
    dropped = Dataset.from_dict({"prompt": [[user], [{"role": "narrator", "content": "once upon"}, user]]})
    with pytest.raises(ConfigError, match="row 2: the chat template leaves out the 'narrator' message 'once upon'"):
        check_prompt_lengths(dropped, tokenizer, 4096, 10, "d")
    failing = Dataset.from_dict({"prompt": [[user], [user], [{"role": "bad", "content": "x"}]]})
    with pytest.raises(ConfigError, match="row 3: the chat template cannot render prompt .*unknown role"):
        check_prompt_lengths(failing, tokenizer, 4096, 10, "d")
