"""``sharpgrpo compare`` end to end: real `sharpgrpo train` runs of the tiny model, Ctrl-C, resume, a crashed run
next to runs that complete, and a config file edited between runs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharpgrpo.cli.compare import main
from sharpgrpo.compare.runs import MARKER, REPO_ROOT, config_hash, parse_strategy
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


def _wait_for(path: Path, process: subprocess.Popen, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"compare exited ({process.returncode}) before {path} appeared:\n"
                                 f"{process.communicate()[1]}")  # fmt: skip
        assert time.monotonic() < deadline, f"{path} did not appear within {limit} s"
        time.sleep(0.1)


@pytest.mark.slow
def test_compare_end_to_end_ctrl_c_resume_and_a_crash(tmp_path, tiny_model_path):
    output = tmp_path / "report"
    common = [
        "--config", "configs/demo.yaml", "--output", str(output),
        "--set", f"model_name_or_path={tiny_model_path}", "max_steps=2", "per_device_train_batch_size=8",
        "num_generations=4", "dataset_kwargs={\"num_prompts\": 16}",
    ]  # fmt: skip
    # Passes the checks compare runs before any run (issue 32: a bad value is refused there, see
    # tests/test_entry_point_errors.py) but not train.py's prompt-length check against the model's 4096-token
    # context, which reads the model's config: each of its runs crashes.
    bad = "equal:max_completion_length=5000"
    full = [*common, "--seeds", "0", "1", "--strategies", "equal", "grpo_sg", bad]
    runs_dir = output / "runs"

    # 1. Ctrl-C, one run at a time (order: equal 0, equal 1, grpo_sg 0, grpo_sg 1, bad 0, bad 1). SIGINT to the
    # process group once equal 0 finished and equal 1 started: the running train.py is stopped, the queued runs never
    # start, the partial report is written, and the command exits with 130 in bounded time.
    process = subprocess.Popen(
        [sys.executable, "-m", "sharpgrpo", "compare", *full, "--jobs", "1", "--stop_grace", "60"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(runs_dir / "equal" / "seed0" / MARKER, process, 120)
        _wait_for(runs_dir / "equal" / "seed1" / "train.log", process, 30)
        os.killpg(process.pid, signal.SIGINT)
        started = time.monotonic()
        _, stderr = process.communicate(timeout=90)
        stopped_after = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    assert stopped_after < 75, stopped_after
    assert "Interrupted: stopped 1 running run(s), cancelled 4 queued run(s)" in stderr
    assert "Re-run the same command to resume" in stderr and "Traceback" not in stderr
    assert not (runs_dir / "grpo_sg").exists() and not (runs_dir / "equal__max_completion_length=5000").exists()
    assert not (runs_dir / "equal" / "seed1" / MARKER).exists()
    interrupted = json.loads((output / "summary.json").read_text())
    assert {(r["strategy"], r["seed"]): r["status"] for r in interrupted["runs"]} == {
        ("equal", 0): "done",
        ("equal", 1): "interrupted",
        ("grpo_sg", 0): "cancelled",
        ("grpo_sg", 1): "cancelled",
        ("equal (max_completion_length=5000)", 0): "cancelled",
        ("equal (max_completion_length=5000)", 1): "cancelled",
    }
    equal0 = interrupted["runs"][0]["metrics"]
    assert equal0["steps"] == 2
    assert "Partial report: the comparison was interrupted." in (output / "report.md").read_text()
    state = runs_dir / "equal" / "seed0" / "trainer_state.json"
    mtime = state.stat().st_mtime_ns

    # 2. The same command again, two at a time: the finished run is reused (not trained again); the interrupted and
    # the queued runs run next to the crashing variant and complete; the crashes are reported with their logs.
    again = main([*full, "--jobs", "2"])
    assert {(r["strategy"], r["seed"]): r["status"] for r in again["runs"]} == {
        ("equal", 0): "skipped",
        ("equal", 1): "done",
        ("grpo_sg", 0): "done",
        ("grpo_sg", 1): "done",
        ("equal (max_completion_length=5000)", 0): "failed",
        ("equal (max_completion_length=5000)", 1): "failed",
    }
    assert state.stat().st_mtime_ns == mtime
    on_disk = json.loads((output / "summary.json").read_text())
    for label in ("equal", "grpo_sg"):
        reward = on_disk["strategies"][label]["metrics"]["final_reward"]
        assert reward["n"] == 2 and reward["low"] <= reward["mean"] <= reward["high"]
    assert on_disk["differences"]["grpo_sg"]["final_reward"]["seeds"] == [0, 1]
    assert on_disk["strategies"]["equal (max_completion_length=5000)"]["seeds"] == []
    runs = {(r["strategy"], r["seed"]): r for r in on_disk["runs"]}
    assert runs[("grpo_sg", 1)]["metrics"]["steps"] == 2 and runs[("equal", 1)]["metrics"]["steps"] == 2
    assert runs[("equal", 0)]["metrics"] == equal0
    report = (output / "report.md").read_text()
    assert "| grpo_sg | 2 |" in report and "2 failed" in report and "Partial report" not in report
    assert (output / "reward.png").stat().st_size > 0 and (output / "grad_norm.png").stat().st_size > 0
    assert (output / "entropy.png").stat().st_size > 0
    for run in on_disk["runs"]:
        if run["status"] == "failed":
            # the run's own error line, from its log, in the report (not only "see the log")
            assert f"seed {run['seed']}: sharpgrpo train exited with code 1: error: " in report
            assert "max_completion_length" in run["error"] and "full traceback" not in run["error"]
            assert run["log"] in report and "max_completion_length" in Path(run["log"]).read_text()
            assert run["metrics"] is None

    # 3. --report_only runs nothing: finished runs are aggregated, the others listed as not run.
    partial = main([*common, "--seeds", "0", "1", "--strategies", "equal", "random", "--report_only"])
    assert {(r["strategy"], r["seed"]): r["status"] for r in partial["runs"]} == {
        ("equal", 0): "skipped",
        ("equal", 1): "skipped",
        ("random", 0): "missing",
        ("random", 1): "missing",
    }
    assert not (runs_dir / "random").exists()
    assert "Not run: random seed 0, random seed 1" in (output / "report.md").read_text()


FAKE_TRAIN = """#!/bin/sh
# Stands in for `python train.py ARGS`: writes a two-step trainer_state.json into --output_dir, counts its calls.
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--output_dir" ]; then out="$2"; fi
  shift
done
echo x >> "$out/../../calls"
printf '{"log_history": [{"step": 1, "reward": 0.5, "grad_norm": 1.0}, {"step": 2, "reward": 0.75, "grad_norm": 1.5}]}' > "$out/trainer_state.json"
"""


def test_resume_reruns_runs_whose_config_file_changed(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text((REPO_ROOT / "configs" / "demo.yaml").read_text())
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_TRAIN)
    fake.chmod(0o755)
    output = tmp_path / "out"
    args = ["--config", str(config), "--output", str(output), "--seeds", "0", "--strategies", "equal",
            "--python", str(fake), "--set", "max_steps=2"]  # fmt: skip
    calls = output / "runs" / "calls"

    def statuses(summary):
        return [r["status"] for r in summary["runs"]]

    assert statuses(main(args)) == ["done"]
    marker = json.loads((output / "runs" / "equal" / "seed0" / MARKER).read_text())
    assert len(marker["config_hash"]) == 64
    assert statuses(main(args)) == ["skipped"] and len(calls.read_text().split()) == 1
    capsys.readouterr()

    # Same arguments, edited config file: the finished run is stale and runs again (said on stderr).
    config.write_text(config.read_text().replace("learning_rate: 1.0e-3", "learning_rate: 2.0e-3"))
    assert statuses(main([*args, "--report_only"])) == ["missing"]
    assert "equal seed 0 (config file or overrides changed since it ran)" in (output / "report.md").read_text()
    assert statuses(main(args)) == ["done"] and len(calls.read_text().split()) == 2
    assert "equal seed 0: config file or overrides changed since it ran; running it again." in capsys.readouterr().err
    assert statuses(main(args)) == ["skipped"]
    # A marker from before the hash was stored (no config_hash) does not count as finished either.
    marker_path = output / "runs" / "equal" / "seed0" / MARKER
    marker = json.loads(marker_path.read_text())
    del marker["config_hash"]
    marker_path.write_text(json.dumps(marker))
    assert statuses(main(args)) == ["done"] and len(calls.read_text().split()) == 3


def test_config_hash_covers_file_contents_and_overrides(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("a: 1\n")
    base = config_hash(config, [("max_steps", "2")])
    assert base == config_hash(config, [("max_steps", "2")])
    assert base != config_hash(config, [("max_steps", "3")])
    assert base != config_hash(config, [("max_steps", "2")], (("thr_p", "0.1"),))
    config.write_text("a: 2\n")
    assert base != config_hash(config, [("max_steps", "2")])


def test_strict_letters_evaluation_task(tmp_path, tiny_model_path):
    from sharpgrpo.evaluation import EvalConfig, evaluate
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


def test_config_by_shipped_name_as_train_takes_it(tmp_path):
    """`--config demo` is the shipped demo config (as `sharpgrpo train --config demo`); an unknown name is refused in
    one line that lists the shipped ones."""
    common = ["--strategies", "equal", "--seeds", "0", "--output", str(tmp_path / "out"), "--report_only"]
    summary = main(["--config", "demo", *common])  # resolved and checked with every entry; nothing runs
    assert [r["status"] for r in summary["runs"]] == ["missing"]
    with pytest.raises(SystemExit) as refused:
        main(["--config", "no_such_config", *common])
    (line,) = str(refused.value).splitlines()
    assert "--config='no_such_config': no such file, and no shipped config of that name" in line and "demo" in line


@pytest.mark.slow
def test_one_owner_per_output_and_the_runs_die_with_the_comparison(tmp_path, tiny_model_path):
    """A second `sharpgrpo compare` on a live --output is refused at once naming the first (the live run's log is
    not truncated); a comparison killed with SIGKILL takes its training run with it (SIGTERM through the death signal:
    the run stops, nothing keeps training in its own session holding its folder's lock)."""
    output = tmp_path / "report"
    argv = ["compare", "--config", "configs/demo.yaml", "--output", str(output), "--seeds", "0", "--strategies",
            "equal", "--set", f"model_name_or_path={tiny_model_path}", "max_steps=500", "per_device_train_batch_size=8",
            "num_generations=4", "dataset_kwargs={\"num_prompts\": 16}"]  # fmt: skip
    first = subprocess.Popen([sys.executable, "-m", "sharpgrpo", *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    run_dir = output / "runs" / "equal" / "seed0"
    try:
        _wait_for(run_dir / ".sharpgrpo.lock", first, 180)  # the training run holds its folder: it is running
        deadline = time.monotonic() + 60
        while not (run_dir / ".sharpgrpo.lock").read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        child = int((run_dir / ".sharpgrpo.lock").read_text())
        log_size = (run_dir / "train.log").stat().st_size
        second = subprocess.run([sys.executable, "-m", "sharpgrpo", *argv], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1].startswith(
            f"error: --output={str(output)!r} is in use by another running sharpgrpo compare (process {first.pid})"
        ), second.stderr[-2000:]
        assert (run_dir / "train.log").stat().st_size >= log_size

        _kill_and_wait_for_its_run(first, child, 90)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    log = (run_dir / "train.log").read_bytes()
    assert b"\0" not in log and b"SIGTERM received" in log, log[-2000:]


def _kill_and_wait_for_its_run(comparison: subprocess.Popen, child: int, limit: float) -> None:
    """SIGKILL the comparison (no handler runs in it), then wait up to ``limit`` seconds for its training process
    ``child`` to end."""
    comparison.kill()
    comparison.wait()
    deadline = time.monotonic() + limit
    while _alive(child):
        assert time.monotonic() < deadline, f"training process {child} outlived the comparison"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its new parent, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_rerun_after_sigkill_finishes_every_run(tmp_path, tiny_model_path):
    """Rule 4's last clause: a comparison killed with SIGKILL mid-training (its run checkpoints and stops on the
    death signal) is finished by the same command run again: no lock of the dead run's is left in the way, the run
    resumes and ends at max_steps, and the report has it."""
    output = tmp_path / "report"
    args = ["--config", "configs/demo.yaml", "--output", str(output), "--seeds", "0", "--strategies", "equal",
            "--set", f"model_name_or_path={tiny_model_path}", "max_steps=200", "per_device_train_batch_size=8",
            "num_generations=4", "save_steps=20", "dataset_kwargs={\"num_prompts\": 16}"]  # fmt: skip
    first = subprocess.Popen([sys.executable, "-m", "sharpgrpo", "compare", *args], cwd=REPO_ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    run_dir = output / "runs" / "equal" / "seed0"
    try:
        _wait_for(run_dir / "train.log", first, 300)
        deadline = time.monotonic() + 300
        while b"'loss'" not in (run_dir / "train.log").read_bytes():  # training has started
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        _kill_and_wait_for_its_run(first, int((run_dir / ".sharpgrpo.lock").read_text()), 120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    again = main(args)
    (run,) = again["runs"]
    assert run["status"] == "done" and run["metrics"]["steps"] == 200
