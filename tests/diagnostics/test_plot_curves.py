"""Training curves and the grad-norm summary from real tiny-model runs."""

from __future__ import annotations

import json
import statistics

import pytest

from sharpgrpo.cli.plot import main as plot_main
from sharpgrpo.diagnostics.curve_plots import plot_runs
from sharpgrpo.diagnostics.curves import find_trainer_state, load_log_history, metric_series, spike_summary

RUN_STEPS = 3  # tiny_runs trains three steps (tests/diagnostics/conftest.py)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # trains the tiny model (tiny_runs)
def test_plot_runs_writes_one_png_per_group_and_the_summary(tiny_runs, tmp_path):
    runs = [tiny_runs["grpo_sg"], tiny_runs["equal"]]
    result = plot_runs(runs, tmp_path / "plots")
    names = sorted(p.split("/")[-1] for p in result["files"])
    assert names == sorted(
        ["reward.png", "grad_norm.png", "entropy.png", "token_weight.png", "clipping.png"]
        + ["grad_norm_summary.json", "grad_norm_summary.md"]
    )
    for name in names:
        path = tmp_path / "plots" / name
        if name.endswith(".png"):
            data = path.read_bytes()
            assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    summary = json.loads((tmp_path / "plots" / "grad_norm_summary.json").read_text())
    assert list(summary) == ["grpo_sg", "equal"]
    for label, run in zip(("grpo_sg", "equal"), runs):
        norms = [entry["grad_norm"] for entry in load_log_history(run) if "grad_norm" in entry]
        assert len(norms) == RUN_STEPS
        assert summary[label]["steps"] == RUN_STEPS
        assert summary[label]["std"] == pytest.approx(statistics.pstdev(norms))
        assert summary[label]["max"] == pytest.approx(max(norms))
        assert summary[label]["spikes"] == sum(n > 3 * statistics.median(norms) for n in norms)
    markdown = (tmp_path / "plots" / "grad_norm_summary.md").read_text()
    assert "| Run | Steps | Mean | Std | CV | Median | Max | Spikes (> 3 x median) |" in markdown


@pytest.mark.slow  # trains the tiny model (tiny_runs)
def test_plot_cli(tiny_runs, tmp_path, capsys):
    plot_main([str(tiny_runs["grpo_sg"]), "--output", str(tmp_path), "--labels", "sg", "--smooth", "0.5"])
    assert (tmp_path / "grad_norm.png").is_file()
    assert "| sg | 3 |" in capsys.readouterr().out


@pytest.mark.slow  # trains the tiny model (tiny_runs)
def test_metric_series_skips_missing_and_non_finite(tiny_runs):
    history = load_log_history(tiny_runs["grpo_sg"])
    steps, values = metric_series(history, "token_weight/mean")
    assert steps == list(range(1, RUN_STEPS + 1)) and all(1.0 <= v <= 1.4 for v in values)
    assert metric_series([{"step": 1, "x": float("nan")}, {"step": 2}, {"step": 3, "x": 2.0}], "x") == ([3], [2.0])
    assert metric_series(load_log_history(tiny_runs["equal"]), "token_weight/std")[1] == [0.0] * RUN_STEPS


def test_spike_summary():
    summary = spike_summary([1.0, 1.2, 0.8, 10.0, 1.0], spike_factor=3.0)
    assert summary["median"] == 1.0 and summary["max"] == 10.0 and summary["spikes"] == 1
    assert summary["std"] == pytest.approx(statistics.pstdev([1.0, 1.2, 0.8, 10.0, 1.0]))
    assert spike_summary([1.0, 1.2, 0.8, 10.0, 1.0], spike_factor=20.0)["spikes"] == 0
    assert spike_summary([])["steps"] == 0


def test_find_trainer_state_prefers_the_latest_checkpoint(tmp_path):
    for step in (2, 10, 9):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": step, "grad_norm": 1.0}]}))
    assert find_trainer_state(tmp_path) == tmp_path / "checkpoint-10" / "trainer_state.json"
    assert load_log_history(tmp_path / "checkpoint-2") == [{"step": 2, "grad_norm": 1.0}]
    with pytest.raises(FileNotFoundError):
        find_trainer_state(tmp_path / "checkpoint-10" / "missing")


def test_a_refused_plot_creates_nothing(tmp_path):
    """Every run is read before --output is claimed: a run without a trainer state (the second one here) is refused
    and no output folder (not even one holding only the marker) is left behind."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 0.5}]}))
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match="No trainer_state.json in"):
        plot_main([str(tmp_path / "run"), str(tmp_path / "empty_run"), "--output", str(tmp_path / "plots")])
    assert not (tmp_path / "plots").exists()
