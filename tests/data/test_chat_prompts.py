"""Plain-string prompts and a chat template: train.py warns once when the template would go unused, and the K&K
evaluation never nests Logic-RL's ready chat string inside the model's own template. The tokenizer is the tiny
model's real one (a ChatML template, as Qwen2.5 and SmolLM2 use)."""

from __future__ import annotations

import json
import warnings

import pytest

from sharpgrpo.data import chat_prompts
from sharpgrpo.data.checks import load_checked_dataset
from sharpgrpo.evaluation.generation import render_prompt
from sharpgrpo.evaluation.runner import EvalConfig
from sharpgrpo.evaluation.tasks import EVAL_TASKS
from sharpgrpo.models.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(chat_prompts, "_warned", False)


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?"}) + "\n" for i in range(4)))
    return str(path)


def template_warnings(tokenizer, name, kwargs):
    dataset = load_checked_dataset(name, kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chat_prompts.warn_if_template_unused(dataset, tokenizer, name, kwargs)
        chat_prompts.warn_if_template_unused(dataset, tokenizer, name, kwargs)  # once per process
    return [str(w.message) for w in caught]


def test_plain_prompts_for_a_chat_template_warn_once_naming_conversational(tokenizer, jsonl, fresh_warning):
    assert chat_prompts.template_markers(tokenizer) == ["<|im_end|>", "<|im_start|>"]
    messages = template_warnings(tokenizer, jsonl, None)
    assert len(messages) == 1
    assert "plain strings" in messages[0] and "`conversational: true`" in messages[0]


@pytest.mark.parametrize("conversational", [True, False])
def test_an_explicit_choice_is_not_warned_about(tokenizer, jsonl, fresh_warning, conversational):
    assert template_warnings(tokenizer, jsonl, {"conversational": conversational}) == []


def test_no_warning_for_ready_chat_strings_plain_text_tasks_or_no_template(tokenizer, jsonl, fresh_warning):
    # K&K's default prompt is Logic-RL's string already in ChatML; the demo task has no conversational form.
    assert template_warnings(tokenizer, "kk", {"num_puzzles": 2, "min_people": 2, "max_people": 2}) == []
    assert template_warnings(tokenizer, "demo", {"num_prompts": 4}) == []
    assert template_warnings(build_tokenizer_without_template(), jsonl, None) == []


def build_tokenizer_without_template():
    plain = build_tokenizer()
    plain.chat_template = None
    return plain


def kk_prompt_text(tokenizer, tmp_path, **options):
    config = EvalConfig(model="unused", task="kk", output=str(tmp_path / "r.json"), kk_people=[2], limit=1, **options)
    (problem,) = EVAL_TASKS.get("kk")().load_problems(config)
    return config, render_prompt(tokenizer, problem.prompt, config.apply_chat_template)[0]


def test_eval_kk_with_the_chat_template_renders_one_chat(tokenizer, tmp_path):
    config, text = kk_prompt_text(tokenizer, tmp_path, apply_chat_template=True)
    assert config.prompt_format == "conversational_prefill"
    # system, user, and the assistant turn opened with <think>: one chat, not Logic-RL's chat inside a user message
    assert text.count("<|im_start|>") == 3 and text.endswith("<|im_start|>assistant\n<think>")
    config, plain = kk_prompt_text(tokenizer, tmp_path)
    assert config.prompt_format == "chat_string" and plain.count("<|im_start|>") == 3
    assert plain.replace("\n", "") == text.replace("\n", "")  # the same prompt, rendered by the model's template


def test_eval_refuses_chat_string_inside_the_chat_template(tmp_path):
    with pytest.raises(ValueError, match="second one.*conversational_prefill"):
        EvalConfig(model="unused", task="kk", output="r.json", prompt_format="chat_string", apply_chat_template=True)
    math = EvalConfig(
        model="unused", task="math", output="r.json", prompt_format="chat_string", apply_chat_template=True
    )
    assert math.prompt_format == "chat_string"  # only K&K reads it
