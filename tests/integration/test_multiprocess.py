"""Several processes (``accelerate launch``, gloo on the CPU) train exactly like one process with the same global batch.

Design. One process with ``per_device_train_batch_size=12`` is compared with two processes with 6 each, 4 completions
per prompt: a generation batch is 3 groups (rows 0-3, 4-7, 8-11) and the middle group is split between the ranks
(rows 4-5 on rank 0, 6-7 on rank 1), while the others are whole on one rank. For the losses to be comparable the two
setups must sample the same completions, but TRL samples on each process from that process's random stream. The
worker (``_launch_worker.RowSeededTrainer``) therefore samples each completion from the model with a generator
seeded by (seed, generation index, global row), so the completions depend on the row and not on the process that
generates it; temperature 2 gives ragged completion lengths (padding across processes) and non-zero on-policy
losses. Training uses plain SGD, so a wrong gradient scale across processes would change every later loss (Adam
would hide it). Compared per step, within 1e-5: the loss, the gradient norm, the reward, every strategy metric
(``cw/*``, ``thr/*``, ``token_weight/*``, ...), and, per generation batch, the sampled completions and the token
advantages the advantage strategies return (for CW-GRPO its Gaussian-kernel weights times A), reassembled from the
ranks' rows.

The two-process runs of all cases share one launch (interpreter start-up dominates their cost). It uses
``configs/accelerate/multi_gpu.yaml`` with ``--num_processes 2``; ``use_cpu=True`` in the training arguments makes
accelerate set up gloo on the CPU. The same launch checks resume under two processes, with TRL's own sampling.
DeepSpeed ZeRO-2/3 runs (``configs/accelerate/zero2.yaml``/``zero3.yaml``) are compared the same way where
DeepSpeed is installed.

Generation seeding (last section, no vLLM needed): TRL's colocated vLLM engine is seeded with the process index only,
and a `seed` in `generation_kwargs` would make the G completions of a prompt identical; the trainer reseeds colocated
sampling from `seed` and the process, refuses a request seed in colocate mode, and gives server requests a seed per
generation batch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _launch_worker import COMPARED_PREFIXES, build_config, run_case
from helpers import make_trainer

from sharpgrpo import SharpGRPOTrainer
from sharpgrpo.data.demo import allowed_letters_reward
from sharpgrpo.training.generation.vllm_seeding import (
    colocated_vllm_seed,
    refuse_vllm_request_seed,
    seed_colocated_vllm,
    server_generation_kwargs,
    server_request_seed,
)

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_launch_worker.py")
NUM_PROCESSES, PER_DEVICE, NUM_GENERATIONS, STEPS = 2, 6, 4, 3

CASES = {
    "equal": dict(strategies="equal"),
    "grpo_sg": dict(strategies="grpo_sg"),
    "cw_grpo": dict(strategies="cw_grpo"),
    "cw_grpo_batch_scope": dict(strategies="cw_grpo", cw_scope="batch"),
    "thr": dict(strategies="thr", thr_beta=0.5),  # a lower threshold: the tiny model's tokens rarely pass beta = 1
    "grpo_sg+nthr": dict(strategies=["grpo_sg", "nthr"]),
    "entropy_shaping": dict(strategies="entropy_shaping"),  # the sampling entropy, gathered over the ranks
    "gtpo+ktae": dict(strategies=["gtpo", "ktae"]),
}
RESUME = dict(
    generation="trl", strategies="random", per_device_train_batch_size=4, max_steps=4, save_strategy="steps",
    save_steps=2, steps_per_generation=2, optim="adamw_torch", learning_rate=1e-2,
    max_completion_length=32,  # long enough that the ranks' batches differ in length, so do their generators
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(model_path: str, output_dir: Path, cases: list[dict], accelerate_config: str, timeout: int = 420):
    """Run the worker under ``accelerate launch`` with two processes; return [[rank results] per case]."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / accelerate_config),
        "--num_processes", str(NUM_PROCESSES), "--mixed_precision", "no", "--main_process_port", str(free_port()),
        str(WORKER), "--model", model_path, "--output_dir", str(output_dir), "--cases", json.dumps(cases),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    # The worker imports the tests' helpers.py (as the tests do, from the folder pytest put on sys.path).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"accelerate launch failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return [
        [json.loads((output_dir / f"case_{i}" / f"rank{rank}.json").read_text()) for rank in range(NUM_PROCESSES)]
        for i in range(len(cases))
    ]


@pytest.fixture(scope="module")
def two_process_runs(tiny_model_path, tmp_path_factory):
    """All cases (and the resume pair) in one two-process launch: {case name: [rank 0 result, rank 1 result]}."""
    folder = tmp_path_factory.mktemp("multiprocess")
    cases = [dict(case, per_device_train_batch_size=PER_DEVICE, max_steps=STEPS) for case in CASES.values()]
    full = len(cases)
    cases += [RESUME, dict(RESUME, resume_from_checkpoint=str(folder / f"case_{full}" / "run" / "checkpoint-2"))]
    results = launch(tiny_model_path, folder, cases, "configs/accelerate/multi_gpu.yaml")
    runs = dict(zip(CASES, results, strict=False))
    runs["resume_full"], runs["resume_resumed"] = results[full], results[full + 1]
    runs["_folder"] = folder
    return runs


@pytest.fixture(scope="module")
def one_process_runs(tiny_model_path, tmp_path_factory):
    """The 1-process references, computed on first use: {case name: result}."""
    cache: dict[str, dict] = {}
    folder = tmp_path_factory.mktemp("one_process")

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = run_case(
                tiny_model_path, str(folder / name), **CASES[name],
                per_device_train_batch_size=PER_DEVICE * NUM_PROCESSES, max_steps=STEPS,
            )
        return cache[name]

    return get


def padded(rows: list[list], length: int) -> torch.Tensor:
    return torch.tensor([row + [0] * (length - len(row)) for row in rows], dtype=torch.float64)


def global_generations(ranks: list[dict]) -> list[dict[str, torch.Tensor]]:
    """Reassemble every generation batch from the ranks' rows (rank order = global row order)."""
    batches = []
    for per_rank in zip(*(r["generations"] for r in ranks), strict=True):
        assert [g["first_row"] for g in per_rank] == [rank * PER_DEVICE for rank in range(NUM_PROCESSES)]
        batch = {}
        for key in ("completion_ids", "completion_mask", "advantages"):  # advantages: (B, 1) or token (B, T)
            length = max(len(g[key][0]) for g in per_rank)
            batch[key] = torch.cat([padded(g[key], length) for g in per_rank])
        batches.append(batch)
    return batches


def assert_same_training(multi: dict, single: dict, steps: list[int] | None = None, atol: float = 1e-5) -> None:
    """Per-step loss, grad norm, reward and strategy metrics agree (``steps``: which logged steps; default all)."""
    multi_log = {entry["step"]: entry for entry in multi["log"]}
    single_log = {entry["step"]: entry for entry in single["log"]}
    steps = steps or sorted(single_log)
    assert steps and all(step in multi_log for step in steps), (sorted(multi_log), steps)
    for step in steps:
        m, s = multi_log[step], single_log[step]
        assert m["loss"] == pytest.approx(s["loss"], abs=atol), f"loss at step {step}"
        assert m["grad_norm"] == pytest.approx(s["grad_norm"], rel=atol, abs=atol), f"grad_norm at step {step}"
        assert m.get("reward") == pytest.approx(s.get("reward"), abs=1e-6), f"reward at step {step}"  # None: no
        # generation at this step (steps_per_generation > 1 reuses a buffered batch)
        keys = sorted(k for k in s if k.startswith(COMPARED_PREFIXES))
        assert keys == sorted(k for k in m if k.startswith(COMPARED_PREFIXES))
        for key in keys:
            assert m[key] == pytest.approx(s[key], rel=atol, abs=atol), f"{key} at step {step}"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(CASES))
def test_two_processes_match_one_process(two_process_runs, one_process_runs, name):
    ranks, single = two_process_runs[name], one_process_runs(name)
    assert [r["num_processes"] for r in ranks] == [NUM_PROCESSES] * NUM_PROCESSES
    assert ranks[0]["distributed_type"] == "DistributedType.MULTI_CPU"  # gloo
    assert PER_DEVICE % NUM_GENERATIONS != 0  # a group is split between the ranks
    assert_same_training(ranks[1], ranks[0], atol=0.0)  # logged values are global: every rank logs the same
    assert len(single["log"]) == STEPS
    assert_same_training(ranks[0], single)
    assert ranks[0]["param_sum"] == pytest.approx(single["param_sum"], rel=1e-6)

    multi_batches, single_batches = global_generations(ranks), single["generations"]
    assert len(multi_batches) == len(single_batches) == STEPS
    ragged = False
    for multi, reference in zip(multi_batches, single_batches, strict=True):
        ids = torch.tensor(reference["completion_ids"], dtype=torch.float64)
        mask = torch.tensor(reference["completion_mask"], dtype=torch.float64)
        advantages = torch.tensor(reference["advantages"], dtype=torch.float64)
        assert torch.equal(multi["completion_ids"][:, : ids.size(1)] * multi["completion_mask"][:, : ids.size(1)],
                           ids * mask), "the two setups sampled different completions"
        assert torch.equal(multi["completion_mask"][:, : ids.size(1)], mask)
        valid = mask.bool()
        token_advantages = multi["advantages"][:, : advantages.size(1)].expand_as(mask)
        torch.testing.assert_close(token_advantages[valid], advantages.expand_as(mask)[valid], atol=1e-6, rtol=1e-5)
        assert advantages.abs().max() > 1e-3  # the comparison is not between all-zero advantages
        ragged |= bool(mask.sum(1).min() < mask.sum(1).max())
    assert ragged, "completion lengths never differed: padding across processes was not exercised"

    metrics = single["log"]
    if name.startswith("cw_grpo"):  # the weights really vary
        assert min(entry["cw/weight_min"] for entry in metrics) < 0.9
    if name == "thr":
        assert max(entry["thr/frac_retained"] for entry in metrics) > 0
    if "grpo_sg" in name:
        assert max(entry["token_weight/max"] for entry in metrics) > 1.0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_resume_with_two_processes(two_process_runs):
    """Stopped at step 2 and resumed (``random`` strategy, TRL's sampling, Adam): steps 3-4 are those of the
    uninterrupted run. Each process restores its own strategy state: the ranks' `random` generators differ (they drew
    weights for micro-batches of different lengths), so loading one rank's state on both would change rank 1."""
    full, resumed = two_process_runs["resume_full"], two_process_runs["resume_resumed"]
    assert_same_training(full[0], resumed[0], steps=[3, 4], atol=1e-6)
    for key in ("token_weight/mean", "token_weight/std"):
        assert [e[key] for e in full[0]["log"][2:]] == pytest.approx([e[key] for e in resumed[0]["log"][2:]])
    for rank in range(NUM_PROCESSES):  # every process continued its own strategy state exactly
        assert resumed[rank]["strategy_state"] == full[rank]["strategy_state"]
    checkpoint = two_process_runs["_folder"] / f"case_{len(CASES)}" / "run" / "checkpoint-2"
    states = [torch.load(checkpoint / f"sharpgrpo_strategy_state_{rank}.pt", weights_only=True) for rank in (0, 1)]
    generators = [state["strategies"]["RandomWeights"]["generator"] for state in states]
    assert not torch.equal(generators[0], generators[1])
    assert states[0]["generation_count"] == 1  # steps_per_generation=2: one generation batch for steps 1-2


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_matches_one_process(tiny_model_path, tmp_path, one_process_runs, stage):
    """DeepSpeed ZeRO-2/3 on the CPU (``DS_BUILD_OPS=0 pip install deepspeed``; the first run compiles DeepSpeed's
    CPU communication op, about a minute): same comparison as above for CW-GRPO and THR. Under ZeRO-3 the LM head is
    partitioned, so THR's unembedding must be gathered (sharpgrpo.training.generation.policy_inputs.full_unembedding)."""
    pytest.importorskip("deepspeed")
    names = ["cw_grpo", "thr"]
    cases = [dict(CASES[n], per_device_train_batch_size=PER_DEVICE, max_steps=STEPS) for n in names]
    results = launch(tiny_model_path, tmp_path, cases, f"configs/accelerate/zero{stage}.yaml")
    for name, ranks in zip(names, results, strict=True):
        assert ranks[0]["distributed_type"] == "DistributedType.DEEPSPEED"
        assert_same_training(ranks[0], one_process_runs(name))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_opd_teacher_sharded_under_zero3(tiny_model_path, tmp_path):
    """``opd`` with a teacher named by path under ZeRO-3: the teacher is prepared as TRL prepares its reference model
    (a DeepSpeed engine, partitioned: each process holds about half of its elements), its LM head gathered for the
    scoring, and the two processes train as one process does (loss, grad norm, the opd metrics)."""
    pytest.importorskip("deepspeed")
    from sharpgrpo.models.tiny import build_tiny_model

    teacher = str(build_tiny_model(tmp_path / "teacher" / "qwen2", seed=1))
    case = dict(strategies="opd", teacher_model=teacher, opd_coef=0.5, max_steps=STEPS)
    single = run_case(tiny_model_path, str(tmp_path / "single"), **case,
                      per_device_train_batch_size=PER_DEVICE * NUM_PROCESSES)
    (ranks,) = launch(tiny_model_path, tmp_path / "zero3", [dict(case, per_device_train_batch_size=PER_DEVICE)],
                      "configs/accelerate/zero3.yaml")
    assert ranks[0]["distributed_type"] == "DistributedType.DEEPSPEED"
    assert_same_training(ranks[0], single)
    assert any(abs(entry["opd/gap_mean"]) > 1e-3 for entry in single["log"])  # the teacher really differs
    for rank in ranks:
        local, whole = rank["teacher_numel"]
        assert whole == single["teacher_numel"][1] and local < 0.6 * whole, rank["teacher_numel"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sharpness_probe_refused_under_zero3(tiny_model_path, tmp_path):
    """ZeRO-3 partitions every parameter: the sharpness probe (which perturbs and restores them in place outside the
    forward) is refused when the trainer is built, on every process, naming the field."""
    pytest.importorskip("deepspeed")
    case = dict(CASES["grpo_sg"], per_device_train_batch_size=PER_DEVICE, sharpness_probe_steps=1, expect_error=True)
    (ranks,) = launch(tiny_model_path, tmp_path, [case], "configs/accelerate/zero3.yaml")
    for rank in ranks:
        assert rank["error"].startswith("ConfigError: sharpness_probe_steps=1:"), rank["error"]
        assert "DeepSpeed ZeRO-3" in rank["error"]


@pytest.fixture(scope="module")
def fsdp2_runs(tiny_model_path, tmp_path_factory):
    """Every case for one step under FSDP2 (``_launch_worker.FullyShardedTrainer``: torch's ``fully_shard`` over 2
    gloo processes, each decoder layer and the LM head a unit of its own), in one launch."""
    folder = tmp_path_factory.mktemp("fsdp2")
    cases = [dict(case, per_device_train_batch_size=PER_DEVICE, max_steps=1, fsdp2=True) for case in CASES.values()]
    return dict(zip(CASES, launch(tiny_model_path, folder, cases, "configs/accelerate/multi_gpu.yaml"), strict=True))


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(CASES))
def test_fsdp2_matches_one_process(fsdp2_runs, one_process_runs, name):
    """Under FSDP2 the LM head is a DTensor row shard outside its forward (``.shape`` (V, H), half the elements on
    each process): THR/NTHR read it whole through ``policy_inputs.full_unembedding`` (``full_tensor()``, checked by
    element count) and their hidden states through the whole model's forward (``completion_hidden_states``), where
    the backbone called alone met the root unit's embedding shards. Before that fix THR stopped at step 1 with
    ``aten.mm.default got mixed torch.Tensor and DTensor``. Step 1's loss, gradient norm, reward and strategy
    metrics equal the 1-process run's within the DDP comparison's tolerance (1e-5)."""
    ranks = fsdp2_runs[name]
    assert ranks[0]["distributed_type"] == "DistributedType.MULTI_CPU" and ranks[0]["num_processes"] == NUM_PROCESSES
    assert_same_training(ranks[1], ranks[0], atol=0.0)
    assert_same_training(ranks[0], one_process_runs(name), steps=[1])


# ----------------------------------------------------------------------------------------------------------------
# Generation seeding with vLLM
# ----------------------------------------------------------------------------------------------------------------
def make_launch_trainer(model_path: str, output_dir: Path, **overrides) -> SharpGRPOTrainer:
    """The worker's config (``build_config``) on 16 demo prompts."""
    return make_trainer(model_path, build_config(str(output_dir), **overrides), train_dataset=16)


def test_colocated_vllm_seed_depends_on_training_seed_and_process():
    assert [colocated_vllm_seed(0, rank) for rank in range(4)] == [0, 1, 2, 3]  # TRL's per-process training seed
    assert colocated_vllm_seed(7, 3) != colocated_vllm_seed(8, 3)
    # Processes of one tensor-parallel group must sample alike: same seed within a group, distinct across groups.
    assert [colocated_vllm_seed(5, rank, tensor_parallel_size=2) for rank in range(4)] == [5, 5, 6, 6]


def test_request_seed_refused_with_colocated_vllm(tiny_model_path, tmp_path):
    args = build_config(str(tmp_path), use_vllm=True, vllm_mode="colocate", generation_kwargs={"seed": 3})
    with pytest.raises(ValueError, match="identical"):  # raised before any model or vLLM engine is loaded
        SharpGRPOTrainer(model=tiny_model_path, reward_funcs=[allowed_letters_reward], args=args)
    # Server mode samples a prompt's G completions as one request (n = G), which vLLM seeds seed + i: allowed.
    server = build_config(str(tmp_path), use_vllm=True, vllm_mode="server", generation_kwargs={"seed": 3})
    refuse_vllm_request_seed(server)
    refuse_vllm_request_seed(build_config(str(tmp_path), use_vllm=True, vllm_mode="colocate"))


def test_colocated_sampling_reseeded_from_training_seed(tiny_model_path, tmp_path):
    """After TRL starts the colocated engine (which reseeds the global streams with the process index only), the
    trainer reseeds them from `seed`: runs with different seeds sample differently, runs with the same seed alike."""
    draws = {}
    for seed in (0, 1, 1):
        trainer = make_launch_trainer(tiny_model_path, tmp_path / str(seed), seed=seed)
        torch.manual_seed(0)  # what vLLM's start-up does in colocate mode, whatever the training seed
        seed_colocated_vllm(trainer.args, trainer.accelerator.process_index)
        draws.setdefault(seed, []).append(torch.rand(8))
    assert not torch.equal(draws[0][0], draws[1][0])
    assert torch.equal(draws[1][0], draws[1][1])


def test_server_requests_get_a_seed_per_generation(tiny_model_path, tmp_path):
    trainer = make_launch_trainer(tiny_model_path, tmp_path / "a", seed=0, generation_kwargs={"top_k": 5})
    first = server_generation_kwargs(trainer.args, trainer._generation_count)
    assert first == {"top_k": 5, "seed": server_request_seed(0, 0)}
    trainer._generation_count += 1
    assert server_generation_kwargs(trainer.args, trainer._generation_count)["seed"] != first["seed"]  # a new seed per generation batch
    other = make_launch_trainer(tiny_model_path, tmp_path / "b", seed=1)
    assert server_generation_kwargs(other.args, other._generation_count)["seed"] != first["seed"]  # and per training seed
    assert trainer.args.generation_kwargs == {"top_k": 5}  # the user's kwargs are not modified
    pinned = make_launch_trainer(tiny_model_path, tmp_path / "c", generation_kwargs={"seed": 11})
    assert server_generation_kwargs(pinned.args, pinned._generation_count) == {"seed": 11}  # a seed the user gives is kept
