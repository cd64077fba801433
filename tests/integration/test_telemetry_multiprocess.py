"""Per-token telemetry under two processes (``accelerate launch``, gloo on the CPU): one file per telemetry step,
written by the main process, holding every completion of the generation batch exactly once, in global order, with
the values a one-process run with the same global batch writes (the worker samples each completion from a generator
seeded by its global row, so both setups train on the same completions; tests/integration/test_multiprocess.py)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from _launch_worker import run_case
from test_multiprocess import NUM_PROCESSES, PER_DEVICE, launch

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]  # an `accelerate launch` of two processes

CASE = dict(strategies=["grpo_sg", "cw_grpo"], token_telemetry=True, max_steps=2)


def test_two_processes_write_one_file_with_every_completion_once(tiny_model_path, tmp_path):
    launch(tiny_model_path, tmp_path / "two", [dict(CASE, per_device_train_batch_size=PER_DEVICE)],
           "configs/accelerate/multi_gpu.yaml")
    run_case(tiny_model_path, str(tmp_path / "one"), **CASE, per_device_train_batch_size=PER_DEVICE * NUM_PROCESSES)
    for step in (1, 2):
        name = f"telemetry_{step:06d}.parquet"
        two = pq.read_table(tmp_path / "two" / "case_0" / "run" / "telemetry" / name).to_pandas()
        one = pq.read_table(tmp_path / "one" / "telemetry" / name).to_pandas()
        assert sorted(two["process"].unique().tolist()) == [0, 1]  # both ranks' rows, gathered
        keys = list(zip(two["row"], two["position"], strict=True))
        assert len(keys) == len(set(keys))  # every token once
        assert sorted(two["row"].unique().tolist()) == list(range(PER_DEVICE * NUM_PROCESSES))
        assert keys == sorted(keys)  # global order
        for row, rows in two.groupby("row"):
            assert rows["position"].tolist() == list(range(len(rows)))
            assert (rows["process"] == row // PER_DEVICE).all()  # TRL's rows: process-major
        # the same completions and the same values as one process with the same global batch
        assert two["token_id"].tolist() == one["token_id"].tolist()
        assert two["row"].tolist() == one["row"].tolist()
        for column in ("advantage_trl", "advantage", "advantage/cw_grpo", "weight", "logp", "reward"):
            assert np.allclose(two[column], one[column], rtol=1e-5, atol=1e-5), column
        # each rank computes its loss over its own rows: the shares differ, the loss they add up to is the same
        assert two["loss_contribution"].sum() == pytest.approx(one["loss_contribution"].sum(), rel=1e-4, abs=1e-6)
    assert not list((tmp_path / "two" / "case_0" / "run" / "telemetry").glob("*.partial"))
