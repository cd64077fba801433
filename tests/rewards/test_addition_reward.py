"""The addition task: its reward and answer check, its dataset, its evaluation task."""

import random

import pytest

from reward_fns import answer_check, get_reward_function, reward_columns
from reward_fns.addition import addition_correct, addition_reward, last_number


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("7", 7.0),
        ("3 + 4 = 7.", 7.0),
        ("The answer is 7.0", 7.0),
        ("It is -2", -2.0),
        ("7, not 8", 8.0),
        ("seven", None),
        ("", None),
    ],
)
def test_last_number(reply, expected):
    assert last_number(reply) == expected


def test_reward_is_one_exactly_when_the_last_number_is_the_sum():
    """Against a direct reference on random replies built from random numbers and filler words."""
    rng = random.Random(0)
    words = ["The", "answer", "is", "=", "+", "sum", ",", "."]
    completions, answers, expected = [], [], []
    for _ in range(500):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        length = rng.randint(0, 8)
        tokens = [rng.choice(words) if rng.random() < 0.6 else str(rng.randint(-3, 19)) for _ in range(length)]
        text = " ".join(tokens)
        numbers = [t for t in tokens if t.lstrip("-").isdigit()]
        completions.append([{"role": "assistant", "content": text}] if rng.random() < 0.5 else text)
        answers.append(a + b)
        expected.append(1.0 if numbers and int(numbers[-1]) == a + b else 0.0)
    assert addition_reward(None, completions, answers) == expected
    assert addition_correct(None, completions, answers) == [e == 1.0 for e in expected]


def test_registered_with_its_column_and_answer_check():
    fn = get_reward_function("addition")
    assert fn is addition_reward
    assert reward_columns(fn) == ("answer",)
    assert answer_check(fn) is addition_correct


def test_rows_without_a_gold_get_no_verdict():
    assert addition_reward(None, ["7", "7"], [None, 7]) == [None, 1.0]
    assert addition_correct(None, ["7"], ["n/a"]) == [None]


def test_dataset_rows_are_seeded_questions_with_their_sums():
    from sharpgrpo.data import load_train_dataset
    from sharpgrpo.data.addition import addition_question

    rows = load_train_dataset("addition", num_prompts=50, seed=3)
    again = load_train_dataset("addition", num_prompts=50, seed=3)
    assert rows["prompt"] == again["prompt"] and len(rows) == 50
    for prompt, answer in zip(rows["prompt"], rows["answer"], strict=True):
        assert len(prompt) == 1 and prompt[0]["role"] == "user"
        a, b = (int(x) for x in prompt[0]["content"].split("?")[0].removeprefix("What is ").split(" + "))
        assert prompt[0]["content"] == addition_question(a, b) and answer == a + b and 0 <= a <= 9 and 0 <= b <= 9
    plain = load_train_dataset("addition", num_prompts=5, conversational=False)
    assert all(isinstance(p, str) for p in plain["prompt"])


def test_dataset_refuses_bad_arguments():
    from sharpgrpo.data import DATASETS
    from sharpgrpo.validation import ConfigError, validate_arguments

    with pytest.raises(ConfigError, match=r"dataset_kwargs\.num_prompts=0"):
        validate_arguments(DATASETS.get("addition"), {"num_prompts": 0}, "dataset_kwargs")
    with pytest.raises(ConfigError, match=r"dataset_kwargs\.conversational='yes'"):
        validate_arguments(DATASETS.get("addition"), {"conversational": "yes"}, "dataset_kwargs")


def test_evaluation_task_covers_every_pair_and_scores_with_the_check():
    from sharpgrpo.evaluation.runner import EvalConfig
    from sharpgrpo.evaluation.tasks import EVAL_TASKS

    task = EVAL_TASKS.get("addition")()
    problems = task.load_problems(EvalConfig(model="m", task="addition", output="o"))
    assert len(problems) == 100 and sum(p.group == "carry" for p in problems) == 45
    replies = [[str(p.reference["answer"]), "0.5"] for p in problems]
    scores = task.score(problems, replies)
    assert all(s == [True, False] for s in scores)
    records = [{"group": p.group, "correct": [s[0]]} for p, s in zip(problems, scores, strict=True)]
    summary = task.summarize(records)
    assert summary["overall"] == {"accuracy": 1.0, "problems": 100}
    assert "| m | 100.0 | 100.0 | 100.0 |" in task.markdown(summary, "m")
