"""benchmarks/gpu_suite.py, the one command that takes every GPU figure, run as its CPU dry run (tiny shapes, float32,
Triton in its CPU interpreter) so that its code paths cannot rot while no GPU is at hand: every part completes,
the THR kernel paths agree with the float64 reference, the ratio tables hold the A/A control, one strategy of each
kind trains a step with finite metrics and telemetry, a mixture of experts trains with routing replay off and on;
and its list of offline wheels covers what the project needs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"


def load_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_strategy_per_kind() -> list[str]:
    """grpo_sg (weight), thr (advantage: THR's score inside a training step), kl_cov (loss, two updates per batch)."""
    from sharpgrpo.strategies import STRATEGIES

    names = ["grpo_sg", "kl_cov", "thr"]
    assert {STRATEGIES.get(name).kind for name in names} == {STRATEGIES.get(n).kind for n in STRATEGIES.names()}
    return names


def test_dry_run_takes_every_figure(tmp_path):
    strategies = one_strategy_per_kind()  # the dry run of all of them is the same loop, 1 s each
    out = tmp_path / "suite.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "SHARPGRPO_THR_KERNEL": "auto"}
    run = subprocess.run([sys.executable, str(SUITE), "--dry-run", "--strategies", *strategies, "--json", str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["errors"] == {} and result["dry_run"] is True

    thr = result["thr"]
    assert set(thr["paths"]) == {"torch", "triton-tokens", "triton"}
    for path, entry in thr["paths"].items():
        assert [row["L"] for row in entry["rows"]] == [4, 8, 16]
        assert f"--fused-kernel {path}" in entry["command"]
        assert all(row["thr_s"] > 0 and row["method_floor_s"] > 0 and row["kernel_path"] == path
                   for row in entry["rows"])
    # the Triton paths, run by the interpreter, against the float64 reference and the torch path (fp32)
    assert set(thr["reference_rel_err"]) == {"triton-tokens", "triton"}
    assert max(thr["reference_rel_err"].values()) < 1e-5
    assert max(thr["agreement_with_torch"].values()) < 1e-5
    assert thr["auto_path"] == "torch"  # no CUDA here
    headline = re.compile(r"^THR score \(G=4, L=16, V=256, H=32, float32\) on cpu \(\d+ cores\): [\d.e-]+ s "
                          r"\(floor [\d.e-]+ s\)$", re.M)
    assert headline.search(run.stdout), run.stdout[:3000]

    ratios = result["ratios"]
    for phase in ("gen", "loss"):
        table = {row["trainer"]: row for row in ratios["phases"][phase]["table"]}
        assert set(table) == set(ratios["variants"]) and "trl#2" in table and "thr" in table
        assert ratios["phases"][phase]["rounds"] >= 2
        assert all(row["paired"] > 0 for name, row in table.items() if name != "trl")
        assert "control_within_2pct" in ratios["phases"][phase]
    assert ratios["identical_completions"] is True

    asynchronous = result["async"]
    assert set(asynchronous["variants"]) == {"sync", "sync#2", "async"} and asynchronous["rounds"] == 1
    assert all(row["median_step_seconds"] > 0 and row["tokens_per_second"] > 0
               for row in asynchronous["variants"].values())
    assert re.search(r"^async_generation \(max_staleness 1\) on cpu: [\d.]+ x sync's step time", run.stdout, re.M)

    assert set(result["strategies"]) == set(strategies)
    for name, entry in result["strategies"].items():
        assert entry["status"] == "ok", (name, entry)
        assert entry["steps_logged"] == 1 and entry["telemetry_files"] == 1
        assert entry["nonfinite"] == [] and entry["telemetry_nonfinite"] == []
    assert "command (this part alone): python benchmarks/gpu_suite.py --parts strategies" in run.stdout

    moe = result["moe"]  # a mixture of experts with routing replay off and on
    assert moe["off"]["status"] == moe["on"]["status"] == "ok"
    assert moe["on"]["steps_logged"] == 2 and all(0 <= a <= 1 for a in moe["on"]["agreement"])


def test_offline_wheels_cover_the_project_requirements():
    suite = load_suite()
    listed = {line.split("==")[0] for line in suite.OFFLINE_WHEELS}
    needed = {line.split("==")[0] for line in suite.offline_requirements()}
    assert {"trl", "transformers", "accelerate", "datasets", "peft", "pyarrow"} <= needed
    assert needed <= listed, f"add to OFFLINE_WHEELS: {sorted(needed - listed)}"
    assert "torch" not in listed and not any(name.startswith("nvidia") for name in listed)
    assert "--python-version 3.12 --platform manylinux2014_x86_64" in suite.DOWNLOAD


def test_telemetry_check_flags_nan_and_infinities(tmp_path):
    """The strategies part's telemetry check: a NaN on a loss token or an infinity outside a clip bound is reported;
    a wholly unfilled column, masked tokens and infinite clip bounds ('no clip') are not."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    suite = load_suite()
    nan, inf = float("nan"), float("inf")
    table = pa.table({
        "mask": np.array([1, 1, 0], dtype=np.int8),
        "logp": np.array([-1.0, -2.0, nan], dtype=np.float32),  # NaN only on the masked token: fine
        "unfilled": np.array([nan, nan, nan], dtype=np.float32),
        "kl_cov/epsilon_high": np.array([0.2, inf, 0.2], dtype=np.float32),
        "ratio": np.array([1.0, nan, 1.0], dtype=np.float32),  # a NaN on a loss token
        "weight": np.array([inf, 1.0, 1.0], dtype=np.float32),  # an infinity that is no bound
    })
    pq.write_table(table, tmp_path / "telemetry_000001.parquet")
    problems = suite.telemetry_problems([tmp_path / "telemetry_000001.parquet"])
    assert problems == ["telemetry_000001.parquet:ratio", "telemetry_000001.parquet:weight"]


def test_a_failing_kernel_path_leaves_the_other_figures(monkeypatch):
    """One Triton path that does not build (here: the second kernel raises) is recorded as an error of the THR part;
    the other paths are still timed and checked, and the headline of the path `auto` takes still comes out."""
    for path in (ROOT, ROOT / "benchmarks", ROOT / "tests" / "strategies"):
        monkeypatch.syspath_prepend(str(path))
    from sharpgrpo.strategies import thr_kernels

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(thr_kernels, "triton_error_tile", broken)
    suite = load_suite()
    mode = {**suite.MODES["dry"], "thr": {**suite.MODES["dry"]["thr"], "lengths": [4, 8]}}
    result = suite.thr_part(mode, "cpu")
    assert set(result["paths"]) == {"torch", "triton-tokens"}  # triton failed, the others were timed
    assert set(result["errors"]) == {"thr_bench triton", "reference triton", "agreement triton"}
    assert "out of resources" in result["errors"]["thr_bench triton"]
    assert result["reference_rel_err"]["triton-tokens"] < 1e-5
    assert set(result["agreement_with_torch"]) == {"triton-tokens"}
    assert result["headlines"]["torch"].startswith("THR score (G=4, L=8, V=256, H=32, float32) on cpu: ")
