"""Asynchronous generation with several trainer processes (``accelerate launch``, gloo on the CPU): each process has a
rollout process of its own, reads ahead its own share of the data order, and publishes the policy it trains, whole
(DeepSpeed ZeRO-3 gathers it, FSDP2 makes each DTensor whole).

* Staleness 0 equals synchronous training on two processes: TRL's own sampling on each process against its rollout
  process with that process's random state handed over; every logged number of 3 steps of ``grpo_sg`` and ``thr``
  (hidden states from the rollout processes' capture) is equal, and the final weights are.
* The same under DeepSpeed ZeRO-2 and ZeRO-3 (the synchronous run of the same launch is the reference; ZeRO-3 generates
  with gathered parameters in the trainer, and its rollout processes get the gathered policy).
* Under FSDP2 (``_launch_worker.FullyShardedTrainer``: the policy sharded by ``fully_shard``, the LM head a DTensor
  row shard) the rollout processes get the whole policy: the run equals the DDP one at staleness 0 within the
  multi-process comparison's tolerance. Its synchronous twin cannot run here: TRL's generation on a sharded policy
  needs every process to make the same number of forwards (``_launch_worker`` samples in lockstep for that).
* Staleness 1 on two processes: every step's staleness is at most 1, the second step's batch is one version behind on
  both processes, and no batch was regenerated: each process's read-ahead predicted its own share of the data order
  (accelerate's ``BatchSamplerShard``) exactly.
"""

from __future__ import annotations

import math

import pytest
from test_multiprocess import NUM_PROCESSES, launch

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
TIMING = ("runtime", "per_second", "step_time", "wait_seconds", "train_loss")
PER_DEVICE, STEPS = 6, 3
BASE = dict(generation="trl", per_device_train_batch_size=PER_DEVICE, max_steps=STEPS)


def assert_logs_equal(ours: dict, theirs: dict, atol: float = 0.0) -> int:
    """Every float logged by ``theirs`` (timing aside) is logged by ``ours`` with the same value (within ``atol``);
    returns how many were compared. The final weights' sums agree too."""
    assert len(ours["log"]) == len(theirs["log"]) == STEPS
    compared = 0
    for mine, reference in zip(ours["log"], theirs["log"], strict=True):
        for key, value in reference.items():
            if isinstance(value, float) and not any(part in key for part in TIMING):
                if math.isnan(value):
                    assert math.isnan(mine[key]), key
                else:
                    assert mine[key] == pytest.approx(value, rel=atol, abs=atol), (mine["step"], key)
                compared += 1
        assert mine.get("async/staleness", 0.0) == 0.0
    assert ours["param_sum"] == pytest.approx(theirs["param_sum"], rel=max(atol, 1e-12))
    return compared


@pytest.fixture(scope="module")
def ddp_runs(tiny_model_path, tmp_path_factory):
    """One two-process launch: synchronous and staleness-0 runs of grpo_sg and thr, and a staleness-1 run."""
    cases = {}
    for name in ("grpo_sg", "thr"):
        cases[f"{name}/sync"] = dict(BASE, strategies=name)
        cases[f"{name}/async"] = dict(BASE, strategies=name, async_generation=True, max_staleness=0)
    cases["k1"] = dict(BASE, strategies="grpo_sg", async_generation=True, max_staleness=1, max_steps=4)
    folder = tmp_path_factory.mktemp("async_ddp")
    results = launch(tiny_model_path, folder, list(cases.values()), "configs/accelerate/multi_gpu.yaml")
    return dict(zip(cases, results, strict=True))


@pytest.mark.parametrize("name", ["grpo_sg", "thr"])
def test_staleness_zero_equals_synchronous_training_on_two_processes(ddp_runs, name):
    synchronous, asynchronous = ddp_runs[f"{name}/sync"], ddp_runs[f"{name}/async"]
    assert asynchronous[0]["num_processes"] == NUM_PROCESSES
    for rank in range(NUM_PROCESSES):
        assert assert_logs_equal(asynchronous[rank], synchronous[rank]) > 20
        assert all("async/staleness" in entry for entry in asynchronous[rank]["log"])


def test_staleness_one_on_two_processes_reads_each_share_ahead(ddp_runs):
    for rank in ddp_runs["k1"]:
        log = rank["log"]
        staleness = [entry["async/staleness"] for entry in log]
        assert len(staleness) == 4 and all(0 <= value <= 1 for value in staleness), staleness
        assert staleness[1] == 1.0  # submitted at step 1's call, with step 1's weights, trained at step 2
        assert not any(entry.get("async/regenerated") for entry in log), "a process mispredicted its prompts"
        assert all(math.isfinite(entry["loss"]) for entry in log)


@pytest.mark.parametrize("stage", [2, 3])
def test_staleness_zero_equals_synchronous_training_under_deepspeed(tiny_model_path, tmp_path, stage):
    pytest.importorskip("deepspeed")
    cases = [dict(BASE, strategies="grpo_sg"), dict(BASE, strategies="grpo_sg", async_generation=True,
                                                    max_staleness=0)]
    synchronous, asynchronous = launch(tiny_model_path, tmp_path, cases, f"configs/accelerate/zero{stage}.yaml")
    assert asynchronous[0]["distributed_type"] == "DistributedType.DEEPSPEED"
    for rank in range(NUM_PROCESSES):
        assert assert_logs_equal(asynchronous[rank], synchronous[rank], atol=1e-6) > 20


def test_fsdp2_policy_reaches_the_rollout_processes_whole(ddp_runs, tiny_model_path, tmp_path):
    case = dict(BASE, strategies="thr", async_generation=True, max_staleness=0, fsdp2=True)
    (sharded,) = launch(tiny_model_path, tmp_path, [case], "configs/accelerate/multi_gpu.yaml")
    for rank in range(NUM_PROCESSES):
        assert assert_logs_equal(sharded[rank], ddp_runs["thr/async"][rank], atol=1e-5) > 20
