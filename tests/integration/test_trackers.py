"""``report_to`` trackers receive the token telemetry: a real ``sharpgrpo train`` run (the tiny model, 2 steps,
``token_telemetry: true``, ``--report_to trackio tensorboard``, offline) is read back from each tracker's own store:
trackio's local SQLite database (through trackio's own reader) and TensorBoard's event files (its
``EventAccumulator``). Each must hold the step summary as ``telemetry/*`` metrics equal to the ones
``trainer_state.json`` logged, and, for each telemetry step, the token-viewer page and the completions table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]

READ_TRACKIO = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
project = sys.argv[1]
runs = SQLiteStorage.get_runs(project)
print(json.dumps({"runs": [str(r) for r in runs], "logs": SQLiteStorage.get_logs(project, runs[0])}, default=str))
"""


@pytest.fixture(scope="module")
def tracked_run(tiny_model_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("trackers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "OMP_NUM_THREADS": "1",
           "TRACKIO_DIR": str(root / "trackio"), "SHARPGRPO_DEBUG": "1"}  # fmt: skip
    config = root / "tracked.yaml"  # the demo, reporting to both trackers (a list: YAML's, as the flag takes one)
    demo = (REPO / "configs" / "demo.yaml").read_text(encoding="utf-8")
    config.write_text(demo.replace("report_to: none", "report_to: [trackio, tensorboard]"), encoding="utf-8")
    assert config.read_text(encoding="utf-8") != demo
    command = [sys.executable, "-m", "sharpgrpo", "train", "--config", str(config), "--model_name_or_path",
               tiny_model_path, "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
               "--max_completion_length", "6", "--token_telemetry", "true", "--plot", "false", "--project",
               "sharpgrpo-test", "--output_dir", str(root / "run")]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    read = subprocess.run([sys.executable, "-c", READ_TRACKIO, "sharpgrpo-test"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert read.returncode == 0, read.stderr[-3000:]
    state = json.loads((root / "run" / "trainer_state.json").read_text())
    return root, json.loads(read.stdout.splitlines()[-1]), state


def logged_telemetry(state) -> dict[int, dict[str, float]]:
    """step -> the telemetry metrics trainer_state.json holds for it."""
    return {entry["step"]: {k: v for k, v in entry.items() if k.startswith("telemetry/")}
            for entry in state["log_history"] if any(k.startswith("telemetry/") for k in entry)}  # fmt: skip


@pytest.mark.slow
def test_trackio_gets_the_telemetry_summary_page_and_completions(tracked_run):
    root, trackio_store, state = tracked_run
    expected = logged_telemetry(state)
    assert sorted(expected) == [1, 2]  # both steps are telemetry steps (logging_steps 1)
    for names in expected.values():
        assert {"telemetry/weight/p50", "telemetry/advantage/p90", "telemetry/ratio/p10", "telemetry/clip_fraction",
                "telemetry/zero_weight_fraction"} <= set(names)  # fmt: skip
    logs = trackio_store["logs"]
    for step, metrics in expected.items():  # the same numbers, under transformers' train/ prefix, at that step
        entry = next(e for e in logs if e.get("train/global_step") == step and "train/telemetry/weight/p50" in e)
        assert {k: entry[f"train/{k}"] for k in metrics} == pytest.approx(metrics, rel=1e-6)
    for step in expected:
        artifacts = next(e for e in logs if e.get("train/global_step") == step and "telemetry/tokens" in e)
        page = artifacts["telemetry/tokens"]
        assert page["_type"] == "trackio.html"
        html = (root / "trackio" / "media" / page["file_path"]).read_text(encoding="utf-8")
        assert "What was trained on" in html and f"step {step}" in html
        table = artifacts["telemetry/completions"]
        assert table["_type"] == "trackio.table"
        frame = pq.read_table(root / "run" / "telemetry" / f"telemetry_{step:06d}.parquet").to_pandas()
        # the summary is the step's file: a median and a fraction recounted token by token
        kept = [t for t in frame.to_dict("records") if t["mask"] == 1]
        weights = sorted(float(t["weight"]) for t in kept)
        middle = len(weights) // 2
        median = weights[middle] if len(weights) % 2 else (weights[middle - 1] + weights[middle]) / 2
        assert expected[step]["telemetry/weight/p50"] == pytest.approx(median, rel=1e-9)
        clipped = sum(1 for t in kept if t["clip_low"] or t["clip_high"])
        assert expected[step]["telemetry/clip_fraction"] == pytest.approx(clipped / len(kept), rel=1e-9)
        assert expected[step]["telemetry/loss_tokens"] == len(kept)
        rows = table["_value"]
        assert len(rows) == frame["row"].nunique() == 8 and {r["step"] for r in rows} == {step}
        first = frame[frame["row"] == 0].sort_values("position")
        assert rows[0]["completion"] == "".join(first["token"]) and rows[0]["advantage_trl"] == pytest.approx(
            float(first["advantage_trl"].iloc[0]))


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_telemetry_summary_and_completions(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, _, state = tracked_run
    expected = logged_telemetry(state)
    events = sorted((root / "run").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    accumulator = EventAccumulator(str(events[0].parent), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    scalars = set(accumulator.Tags()["scalars"])
    for step, metrics in expected.items():
        for name, value in metrics.items():
            assert f"train/{name}" in scalars, name
            logged = {e.step: e.value for e in accumulator.Scalars(f"train/{name}")}
            assert logged[step] == pytest.approx(value, rel=1e-6, abs=1e-7), name
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in accumulator.Tensors(
        "telemetry/completions/text_summary")}  # fmt: skip
    assert sorted(texts) == sorted(expected)
    assert all(text.startswith("| step | group | completion_index | prompt | completion |") for text in texts.values())
    assert all(len(text.splitlines()) == 2 + 8 for text in texts.values())  # header, rule, one line per completion
    pages = {e.step: e.tensor_proto.string_val[0].decode() for e in accumulator.Tensors("telemetry/tokens/text_summary")}
    assert all(f"tokens_{step:06d}.html" in pages[step] for step in expected)


def test_a_tracker_that_is_not_installed_is_refused_before_anything_loads(tmp_path, monkeypatch, capsys):
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    from sharpgrpo.cli import main
    from sharpgrpo.validation import TRACKER_PACKAGES

    missing = [n for n in INTEGRATION_TO_CALLBACK if n not in get_available_reporting_integrations()]
    if not missing:
        pytest.skip("every tracker transformers integrates is installed here")
    name = "wandb" if "wandb" in missing else missing[0]
    argv = ["train", "--config", "demo", "--report_to", name, "--output_dir", str(tmp_path / "run")]
    monkeypatch.setattr(sys, "argv", ["sharpgrpo", *argv])
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: report_to={name!r}: the {TRACKER_PACKAGES.get(name, name)} package is not "
                           "installed")  # fmt: skip
    assert not (tmp_path / "run").exists()  # refused before the output folder, let alone a model
