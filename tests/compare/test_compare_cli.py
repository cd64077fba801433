"""``python -m sharpgrpo.compare`` end to end: real train.py runs of the tiny model, a crashed run, resume."""

import json
from pathlib import Path

import pytest

from sharpgrpo.compare import main, parse_strategy
from sharpgrpo.tasks.strict_letters import strict_letters_correct, strict_letters_reward


def test_parse_strategy_entries():
    spec = parse_strategy("grpo_sg+thr:thr_p=-0.1,thr_beta=2")
    assert spec.names == ("grpo_sg", "thr") and spec.params == (("thr_p", "-0.1"), ("thr_beta", "2"))
    assert spec.label == "grpo_sg+thr (thr_p=-0.1, thr_beta=2)"
    assert spec.slug == "grpo_sg+thr__thr_p=-0.1__thr_beta=2"
    assert parse_strategy("equal").label == "equal"
    for bad in ("", "thr:", "thr:thr_p", "a++b", "thr:=1"):
        with pytest.raises(ValueError):
            parse_strategy(bad)


def test_unknown_strategy_or_reserved_override_fails_before_running(tmp_path):
    base = ["--config", "configs/demo.yaml", "--seeds", "0", "--output", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        main([*base, "--strategies", "equal", "no_such_strategy"])
    with pytest.raises(SystemExit):
        main([*base, "--strategies", "equal", "--set", "seed=3"])
    assert not (tmp_path / "out").exists()


def test_strict_letters_reward_is_binary_correctness():
    completions = [" abcab", "abca", " a b c a b x", "abcax", ""]
    allowed = ["abc"] * len(completions)
    assert strict_letters_correct(None, completions, allowed) == [True, False, True, False, False]
    assert strict_letters_reward(None, completions, allowed) == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_compare_end_to_end_resume_then_a_crash(tmp_path, tiny_model_path):
    output = tmp_path / "report"
    common = [
        "--config", "configs/demo.yaml", "--output", str(output), "--jobs", "2",
        "--set", f"model_name_or_path={tiny_model_path}", "max_steps=2", "per_device_train_batch_size=8",
        "num_generations=4", "dataset_kwargs={\"num_prompts\": 16}",
    ]  # fmt: skip
    summary = main([*common, "--seeds", "0", "1", "--strategies", "equal", "grpo_sg"])
    assert {(r["strategy"], r["seed"], r["status"]) for r in summary["runs"]} == {
        ("equal", 0, "done"),
        ("equal", 1, "done"),
        ("grpo_sg", 0, "done"),
        ("grpo_sg", 1, "done"),
    }
    on_disk = json.loads((output / "summary.json").read_text())
    equal = on_disk["strategies"]["equal"]["metrics"]
    assert equal["final_reward"]["n"] == 2 and equal["final_reward"]["low"] <= equal["final_reward"]["mean"]
    assert on_disk["differences"]["grpo_sg"]["final_reward"]["seeds"] == [0, 1]
    runs = {(r["strategy"], r["seed"]): r for r in on_disk["runs"]}
    assert runs[("grpo_sg", 1)]["metrics"]["steps"] == 2
    assert "| grpo_sg | 2 |" in (output / "report.md").read_text()
    assert (output / "reward.png").stat().st_size > 0 and (output / "grad_norm.png").stat().st_size > 0
    states = {k: Path(r["directory"]) / "trainer_state.json" for k, r in runs.items()}
    mtimes = {k: p.stat().st_mtime_ns for k, p in states.items()}

    # Resume (seed 0) with a parameter variant that train.py rejects: the finished runs are kept (not trained
    # again), the variant's run crashes and is reported with its log, and the report is still written.
    again = main([*common, "--seeds", "0", "--strategies", "equal", "grpo_sg", "equal:learning_rate=not_a_number"])
    statuses = {(r["strategy"], r["seed"]): r["status"] for r in again["runs"]}
    assert statuses == {
        ("equal", 0): "skipped",
        ("grpo_sg", 0): "skipped",
        ("equal (learning_rate=not_a_number)", 0): "failed",
    }
    assert {k: p.stat().st_mtime_ns for k, p in states.items()} == mtimes
    assert (
        again["strategies"]["grpo_sg"]["metrics"]["final_reward"]["mean"]
        == runs[("grpo_sg", 0)]["metrics"]["final_reward"]
    )
    report = (output / "report.md").read_text()
    for run in again["runs"]:
        if run["status"] == "failed":
            assert run["log"] in report and "learning_rate" in Path(run["log"]).read_text()
            assert run["metrics"] is None

    # --report_only runs nothing: finished runs are aggregated, the others listed as not run.
    partial = main([*common, "--seeds", "0", "1", "--strategies", "equal", "random", "--report_only"])
    assert {(r["strategy"], r["seed"]): r["status"] for r in partial["runs"]} == {
        ("equal", 0): "skipped",
        ("equal", 1): "skipped",
        ("random", 0): "missing",
        ("random", 1): "missing",
    }
    assert not (output / "runs" / "random").exists()
    assert "Not run: random seed 0, random seed 1" in (output / "report.md").read_text()


def test_strict_letters_evaluation_task(tmp_path, tiny_model_path):
    from sharpgrpo.evaluation import EvalConfig, evaluate
    from sharpgrpo.tasks import register_tasks

    register_tasks()
    config = EvalConfig(
        model=tiny_model_path, task="strict_letters", output=str(tmp_path / "eval.json"), limit=4, n_samples=4,
        max_new_tokens=8, temperature=1.0, top_p=1.0, backend="transformers", progress=False,
    )  # fmt: skip
    result = evaluate(config)
    records = [json.loads(line) for line in (tmp_path / "eval.samples.jsonl").read_text().splitlines()[1:]]
    assert sorted((r["group"], len(r["completions"])) for r in records) == [("greedy", 1)] * 4 + [("sampled", 4)] * 4
    for record in records:  # the stored verdicts are the reward's answer check
        allowed = [record["reference"]["allowed"]] * len(record["completions"])
        assert record["correct"] == strict_letters_correct(None, record["completions"], allowed)
    greedy = [r["correct"][0] for r in records if r["group"] == "greedy"]
    overall = result["summary"]["overall"]
    assert overall["accuracy"] == pytest.approx(sum(greedy) / 4)
    assert set(overall["pass@k"]) == {"1", "2", "4"}
