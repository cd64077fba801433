"""K&K puzzles: brute-force solver, generator semantics (Xie et al. 2024), prompt, loaders and datasets."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_fns.kk import kk_correct, kk_reward
from sharpgrpo.data import load_train_dataset
from sharpgrpo.data.kk import (
    KK_CHAT_TEMPLATE,
    PuzzleSampler,
    evaluate,
    generate_puzzles,
    kk_prompt,
    load_kk_file,
    load_shared_kk,
    parse_statements,
    render_statement,
    solve,
)
from sharpgrpo.paths import shared_data_dir

KK_DIR = shared_data_dir("kk")
needs_shared_kk = pytest.mark.skipif(KK_DIR is None, reason="shared K&K data (shared/data/kk) is not available")
GENERATOR_FIELDS = ["quiz", "names", "solution", "solution_text", "solution_text_format", "statements", "index"]


def brute_force(statements):
    """The definition, spelled out: every assignment whose knights say true things and knaves false ones."""
    return [
        assignment
        for assignment in itertools.product([True, False], repeat=len(statements))
        if all(assignment[i] == evaluate(s, assignment) for i, s in enumerate(statements))
    ]


def test_solver_on_hand_made_puzzles():
    # A: "B is a knave". B: "A and I are both knights" -> A knight, B knave.
    assert solve((("lying", 1), ("and", ("telling-truth", 0), ("telling-truth", 1)))) == [(True, False)]
    # A: "I am a knight" alone has two solutions; "A is a knave" said by B pins both down.
    assert solve((("telling-truth", 0),)) == [(True,), (False,)]
    # A: "B is a knight iff A is a knave" (the regen 2ppl #0 shape) with B: "A is not a knight".
    statements = (("not", ("telling-truth", 1)), ("<=>", ("telling-truth", 1), ("lying", 0)))
    assert solve(statements) == [(False, True)]
    # A: "If A is a knight then B is a knave", B: "A is a knight or B is a knight": no consistent assignment
    # ((T,T): A's claim is false; (T,F): B, a knave, says something true; (F,*): A, a knave, says something true).
    assert (
        solve((("->", ("telling-truth", 0), ("lying", 1)), ("or", ("telling-truth", 0), ("telling-truth", 1)))) == []
    )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n_people=st.integers(2, 8))
def test_truth_table_solver_equals_direct_enumeration(seed, n_people):
    sampler = PuzzleSampler(n_people, seed=seed)
    for _ in range(3):
        statements = sampler.puzzle()
        assert solve(statements) == brute_force(statements)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n_people=st.integers(2, 8))
def test_generated_puzzles_follow_the_generator_semantics(seed, n_people):
    rows = generate_puzzles(n_people, 6, seed=seed)
    assert len({row["statements"] for row in rows}) == len(rows)  # no duplicates
    for row in rows:
        statements = parse_statements(row["statements"])
        assert len(statements) == n_people == row["n_people"]
        assert solve(statements) == [tuple(row["solution"])]  # exactly one solution
        assert len(set(row["names"])) == n_people
        for speaker, statement in enumerate(statements):
            leaves = [statement] if statement[0] in ("telling-truth", "lying") else list(statement[1:])
            assert all(leaf[0] in ("telling-truth", "lying") for leaf in leaves)  # depth <= 2
            assert ("lying", speaker) not in leaves  # nobody says "I am a knave"
            if statement[0] in ("and", "or", "->", "<=>"):
                assert len(leaves) == 2 and leaves[0] != leaves[1]
            assert render_statement(statement, row["names"]) in row["quiz"]
        lines = row["solution_text_format"].split("\n")
        assert lines == [
            f"({i}) {name} is {'a knight' if knight else 'a knave'}"
            for i, (name, knight) in enumerate(zip(row["names"], row["solution"], strict=True), 1)
        ]
        assert row["prompt"] == KK_CHAT_TEMPLATE.format(quiz=row["quiz"])


def test_two_person_puzzle_space():
    """Enumerating every two-person puzzle the sampler can draw: 30 statements each, 399 with exactly one solution."""
    leaves = {
        0: [("telling-truth", 0), ("telling-truth", 1), ("lying", 1)],
        1: [("telling-truth", 0), ("lying", 0), ("telling-truth", 1)],
    }
    statements = {
        speaker: leaves[speaker]
        + [("not", leaf) for leaf in leaves[speaker]]
        + [(op, a, b) for op in ("and", "or", "->", "<=>") for a in leaves[speaker] for b in leaves[speaker] if a != b]
        for speaker in (0, 1)
    }
    assert len(statements[0]) == len(statements[1]) == 30
    assert sum(len(solve(puzzle)) == 1 for puzzle in itertools.product(statements[0], statements[1])) == 399
    sampled = {PuzzleSampler(2, seed=seed).statement(1, 2) for seed in range(400)}
    assert sampled <= set(statements[1])


def test_generation_is_seeded():
    assert generate_puzzles(4, 5, seed=7) == generate_puzzles(4, 5, seed=7)
    assert generate_puzzles(4, 5, seed=7) != generate_puzzles(4, 5, seed=8)
    assert generate_puzzles(4, 3, seed=7, start_index=2) == generate_puzzles(4, 5, seed=7)[2:]
    with pytest.raises(ValueError, match="n_people"):
        generate_puzzles(9, 1)


def test_the_reward_scores_generated_puzzles():
    for row in generate_puzzles(5, 5, seed=3):
        gold = row["solution_text_format"]
        perfect = f" reasoning </think>\n<answer>\n{gold}\n</answer>"
        first, *rest = gold.split("\n")
        flipped = first.replace("knight", "knave") if "knight" in first else first.replace("knave", "knight")
        wrong = perfect.replace(first, flipped)
        assert kk_reward([row["prompt"]], [perfect], solution_text_format=[gold]) == [3.0]
        assert kk_reward([row["prompt"]], [wrong], solution_text_format=[gold]) == [-0.5]
        assert kk_correct(perfect, gold) and not kk_correct(wrong, gold)


def test_prompt_formats():
    quiz = "A very special island ... So who is a knight and who is a knave?"
    chat = kk_prompt(quiz, "chat_string")
    assert chat.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert chat.endswith(f"<|im_start|>user\n{quiz}\n<|im_end|>\n<|im_start|>assistant\n<think>")
    conversational = kk_prompt(quiz, "conversational")
    assert [m["role"] for m in conversational] == ["system", "user"]
    # Rendered the Qwen way, the messages give back the chat string up to the prefilled <think>.
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversational)
    assert rendered + "<|im_start|>assistant\n<think>" == chat
    assert kk_prompt(quiz, "conversational_prefill")[-1] == {"role": "assistant", "content": "<think>"}
    with pytest.raises(ValueError, match="chat_string"):
        kk_prompt(quiz, "markdown")


@needs_shared_kk
def test_solver_solves_every_shared_puzzle():
    files = sorted(KK_DIR.glob("*.jsonl"))
    assert len(files) == 12
    count = 0
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            assert solve(parse_statements(row["statements"])) == [tuple(row["solution"])], (path.name, row["index"])
            count += 1
    assert count == 1200


@needs_shared_kk
@pytest.mark.parametrize("n_people", range(2, 9))
def test_generator_reproduces_the_published_test_split(n_people):
    """Seed 1234, indices 0-99: the K&K test split regenerated with the original generator (shared SOURCES.md)."""
    expected = [json.loads(line) for line in (KK_DIR / f"kk_test_regen_{n_people}ppl.jsonl").open(encoding="utf-8")]
    generated = generate_puzzles(n_people, 100, seed=1234)
    for row, reference in zip(generated, expected, strict=True):
        assert {k: row[k] for k in GENERATOR_FIELDS} == {k: reference[k] for k in GENERATOR_FIELDS}


@needs_shared_kk
@pytest.mark.parametrize("n_people", [3, 7])
def test_generator_reproduces_logicrl_test_rows_and_prompts(n_people):
    """Indices 1000-1099 are Logic-RL's test parquet rows, prompt included."""
    path = KK_DIR / f"logicrl_test_{n_people}ppl.jsonl"
    expected = [json.loads(line) for line in path.open(encoding="utf-8")]
    generated = generate_puzzles(n_people, 100, seed=1234, start_index=1000)
    for row, reference in zip(generated, expected, strict=True):
        assert {k: row[k] for k in GENERATOR_FIELDS} == {k: reference[k] for k in GENERATOR_FIELDS}
        assert row["prompt"] == reference["prompt"][0]["content"]


@needs_shared_kk
def test_loaders_read_both_shared_formats():
    regen = load_shared_kk(2, source="regen")
    logicrl = load_shared_kk(5, source="logicrl")
    assert len(regen) == len(logicrl) == 100
    assert regen[0]["index"] == 0 and logicrl[0]["index"] == 1000
    raw = [json.loads(line) for line in (KK_DIR / "logicrl_test_5ppl.jsonl").open(encoding="utf-8")]
    assert [row["prompt"] for row in logicrl] == [r["prompt"][0]["content"] for r in raw]
    assert [row["solution_text_format"] for row in logicrl] == [
        r["reward_model"]["ground_truth"]["solution_text_format"] for r in raw
    ]
    assert load_kk_file(KK_DIR / "kk_test_regen_8ppl.jsonl")[0]["n_people"] == 8
    assert isinstance(load_shared_kk(3, prompt_format="conversational")[0]["prompt"], list)
    with pytest.raises(FileNotFoundError, match="2 people"):
        load_shared_kk(2, source="logicrl")  # Logic-RL has no 2-person split
    with pytest.raises(ValueError, match="regen, logicrl"):
        load_shared_kk(3, source="hf")


def test_kk_training_dataset():
    dataset = load_train_dataset("kk", num_puzzles=12, min_people=3, max_people=5, seed=1234)
    assert len(dataset) == 12
    assert sorted(set(dataset["n_people"])) == [3, 4, 5]
    assert min(dataset["index"]) == 100  # the published test split (indices 0-99) stays out of training
    assert {"prompt", "solution_text_format"} <= set(dataset.column_names)
    assert dataset[0]["prompt"].endswith("<|im_start|>assistant\n<think>")
    conversational = load_train_dataset(
        "kk", num_puzzles=2, min_people=2, max_people=2, prompt_format="conversational"
    )
    assert conversational[0]["prompt"][1]["role"] == "user"
    with pytest.warns(UserWarning, match="Logic-RL's test puzzles"):
        load_train_dataset("kk", num_puzzles=2, min_people=3, max_people=3, start_index=999)
    with pytest.raises(RuntimeError, match="running out"):
        generate_puzzles(2, 1, start_index=400)  # only 399 two-person puzzles have one solution
    with pytest.raises(ValueError, match="min_people"):
        load_train_dataset("kk", num_puzzles=3, min_people=1)
    with pytest.raises(TypeError):
        load_train_dataset("kk", num_people=3)


@needs_shared_kk
def test_kk_shared_dataset():
    dataset = load_train_dataset("kk_shared", source="regen", n_people=[2, 8])
    assert len(dataset) == 200 and sorted(set(dataset["n_people"])) == [2, 8]
    assert len(load_train_dataset("kk_shared")) == 500  # Logic-RL's 3-7 people test rows


def test_missing_shared_file_says_where_to_put_it(monkeypatch):
    import sharpgrpo.data.kk as kk_module

    monkeypatch.setattr(kk_module, "shared_data_dir", lambda subdir="": None)
    with pytest.raises(FileNotFoundError, match=r"logicrl_test_3ppl\.jsonl .*data/kk/ .*K-and-K/knights-and-knaves"):
        kk_module.shared_kk_path(3, "logicrl")
