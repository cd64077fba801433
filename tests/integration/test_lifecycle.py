"""Nothing lost: a real SIGTERM or SIGINT during ``python train.py``, a real SIGKILL while a checkpoint is written,
``--resume_from_checkpoint true``, incomplete and damaged checkpoints, the non-finite stop, and the strategy state
under ``torch.load(weights_only=True)``.

Design of the signal test, once per signal (SIGTERM, SIGINT). Subprocesses of ``train.py --config configs/demo.yaml``
(the tiny model, 16 steps at a constant learning rate, a checkpoint every 2 steps): an uninterrupted run (shared by
both signals); a run sent the signal a random moment after its checkpoint-2 exists (so at a random step from 2 on),
which must finish the step, save a checkpoint (with the strategy state, ``trainer_state.json`` and the plot) and exit
with 128 + the signal (143, 130); and a rerun with ``--resume_from_checkpoint true`` in the same folder. Every demo
step is a generation boundary (steps_per_generation = 1), and the checkpoint restores weights, Adam, scheduler, every
random stream and the strategy state, so the resumed steps repeat the uninterrupted run's float operations in the
same order on the same machine: the losses and gradient norms of the following steps are compared to 1e-6 (a bound
that allows only for round-off from a different operation order; they are in fact equal).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sharpgrpo.run.lifecycle import (
    COMPLETE_MARKER,
    CheckpointError,
    NonFiniteTrainingError,
    check_checkpoint,
    checkpoint_folders,
    latest_complete_checkpoint,
    resolve_resume_checkpoint,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 16  # the tiny demo runs ~20 steps/s on idle cores: room for the signal to land before the end
# A constant learning rate, so that `max_steps` changes nothing but the length: the interrupted run is given 200 steps
# (it is certain to be running when the signal comes, however loaded the machine), the others STEPS.
ARGS = ["--save_strategy", "steps", "--save_steps", "2", "--lr_scheduler_type", "constant"]


def train_command(output_dir: Path, *extra: str, steps: int = STEPS, plot: bool = False) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/demo.yaml"),
            "--output_dir", str(output_dir), *ARGS, "--max_steps", str(steps), "--plot", str(plot).lower(),
            *extra]  # fmt: skip


def environment() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def step_logs(output_dir: Path) -> dict[int, dict]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry for entry in history if "loss" in entry}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The output folder of an uninterrupted run of STEPS steps."""
    output_dir = tmp_path_factory.mktemp("lifecycle") / "full"
    full = subprocess.run(train_command(output_dir), env=environment(), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert full.returncode == 0, full.stderr[-3000:]
    return output_dir


@pytest.fixture(scope="module", params=[signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def interrupted_run(request, tmp_path_factory):
    """A run sent ``request.param`` after its checkpoint-2, then resumed with ``--resume_from_checkpoint true``."""
    signum = request.param
    interrupted = tmp_path_factory.mktemp(f"lifecycle_{signum.name}") / "interrupted"
    process = subprocess.Popen(train_command(interrupted, steps=200, plot=True), env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 240
    while not (interrupted / "checkpoint-2" / COMPLETE_MARKER).exists():
        assert process.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.02)
    time.sleep(random.uniform(0.0, 0.1))  # a random step from 2 on
    process.send_signal(signum)
    _, stopped_err = process.communicate(timeout=240)
    stop = max(int(p.name.split("-")[1]) for p in interrupted.glob("checkpoint-*") if (p / COMPLETE_MARKER).exists())
    plotted = (interrupted / "training_curves.png").is_file()

    resumed = subprocess.run(train_command(interrupted, "--resume_from_checkpoint", "true"), env=environment(),
                             capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    return {"signal": signum, "interrupted": interrupted, "code": process.returncode, "stopped_err": stopped_err,
            "stop": stop, "plotted": plotted, "resumed": resumed}  # fmt: skip


def test_signal_saves_and_resume_true_continues_like_the_uninterrupted_run(full_run, interrupted_run):
    runs = interrupted_run
    assert runs["code"] == 128 + runs["signal"], runs["stopped_err"][-3000:]  # 143 for SIGTERM, 130 for SIGINT
    assert f"{runs['signal'].name} received" in runs["stopped_err"]
    folder = runs["interrupted"]
    stop = runs["stop"]  # the newest complete checkpoint when the interrupted run exited
    assert stop < STEPS, "the signal arrived after the last step; nothing was interrupted"
    checkpoint = folder / f"checkpoint-{stop}"
    for name in ("model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json",
                 "sharpgrpo_strategy_state.pt", "training_args.json"):  # fmt: skip
        assert (checkpoint / name).is_file(), name

    resumed = runs["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoint}" in resumed.stderr
    assert f"[sharpgrpo] done at step {STEPS}" in resumed.stderr
    full, again = step_logs(full_run), step_logs(folder)
    following = list(range(stop + 1, STEPS + 1))
    assert following and all(step in again for step in following)
    compared = [(full[s][key], again[s][key]) for s in following for key in ("loss", "grad_norm", "reward")]
    assert [b for _, b in compared] == pytest.approx([a for a, _ in compared], abs=1e-6)
    assert runs["plotted"]


def test_the_run_leaves_completions_a_card_and_a_summary(full_run):
    """The demo config writes each step's completions (the token analysis reads them), a model card naming the real
    base model without a fake dataset link and with BibTeX citations, and ends with one summary line."""
    from sharpgrpo.diagnostics.tokens import read_logged_completions

    full = full_run
    assert len(list((full / "completions").glob("completions_*.parquet"))) == STEPS
    prompts, completions = read_logged_completions(full / "completions")
    assert len(prompts) == len(completions) == STEPS * 16  # per_device_train_batch_size rows per generation batch
    assert all(isinstance(c, str) for c in completions) and str(prompts[0]).startswith("letters: ")
    card = (full / "README.md").read_text()
    assert "fine-tuned version of `sharpgrpo-tiny` on the `demo` dataset" in card
    assert "None" not in card and "huggingface.co/datasets/demo" not in card
    assert "@misc{sharpgrpo_grpo_sg," in card and "title = {{Sharpness-Guided" in card


def test_token_analysis_fails_before_loading_the_model_without_completions(tmp_path):
    from sharpgrpo.cli.tokens import main as tokens_main

    (tmp_path / "completions").mkdir()
    with pytest.raises(FileNotFoundError, match="save_completions: true"):  # not the missing model's error
        tokens_main(["--model", str(tmp_path / "no-model"), "--completions", str(tmp_path / "completions"),
                     "--output", str(tmp_path / "tokens")])  # fmt: skip


def test_accelerate_launch_that_starts_one_of_two_processes_is_refused(tmp_path):
    """On a machine without GPUs `accelerate launch --num_processes 2` (no config file, no --multi_gpu) runs ONE
    process; train.py's first check refuses it, naming the working command."""
    script = tmp_path / "check.py"
    script.write_text("from sharpgrpo.run.run_output import check_process_count\ncheck_process_count()\nprint('ran')\n")
    if torch.cuda.device_count() > 1:
        pytest.skip("several GPUs: accelerate launches several processes here")
    launched = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
                               "--mixed_precision", "no", str(script)], env=environment(), capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
    assert launched.returncode != 0 and "ran" not in launched.stdout
    assert "started ONE process" in launched.stderr and "--multi_gpu --num_processes 2" in launched.stderr


def test_resume_skips_incomplete_and_names_damaged_files(full_run, tmp_path):
    source = full_run
    folder = tmp_path / "run"
    shutil.copytree(source / "checkpoint-4", folder / "checkpoint-4")
    # What a SIGKILL while saving checkpoint-6 leaves: some files, no completion marker.
    partial = folder / "checkpoint-6"
    partial.mkdir()
    shutil.copy(source / "checkpoint-6" / "model.safetensors", partial / "model.safetensors")
    assert latest_complete_checkpoint(folder)[0] == folder / "checkpoint-4"
    assert resolve_resume_checkpoint("true", str(folder)) == str(folder / "checkpoint-4")
    assert resolve_resume_checkpoint("false", str(folder)) is None

    # A complete-looking checkpoint whose weights were cut short is skipped too; named directly, it is an error.
    damaged = folder / "checkpoint-8"
    shutil.copytree(source / "checkpoint-8", damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    best, skipped = latest_complete_checkpoint(folder)
    assert best == folder / "checkpoint-4" and any("checkpoint-8" in s and "truncated" in s for s in skipped)
    with pytest.raises(CheckpointError, match="model.safetensors is truncated"):
        resolve_resume_checkpoint(str(damaged), str(folder))
    optimizer = folder / "checkpoint-4" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="optimizer.pt is damaged or was cut short"):
        check_checkpoint(folder / "checkpoint-4")
    state = damaged / "trainer_state.json"
    state.write_text(state.read_text()[:100])
    with pytest.raises(CheckpointError, match="trainer_state.json is not valid JSON"):
        check_checkpoint(damaged)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_resume_checkpoint(True, str(tmp_path / "empty"))


def test_sigkill_while_saving_resumes_from_the_previous_complete_checkpoint(tmp_path, capsys):
    """A real SIGKILL in the middle of writing a checkpoint. The run saves every step; as soon as its newest
    checkpoint-N folder has its weights file but not yet the completion marker (and an older checkpoint exists), the
    test stops the process (SIGSTOP, waiting until it is stopped) and, if the marker is still absent, SIGKILLs it
    there; otherwise it lets the run go on (SIGCONT) to the next checkpoint. Resolving `--resume_from_checkpoint true`
    must skip checkpoint-N, naming it, and take the previous complete checkpoint, saying which."""
    output_dir = tmp_path / "killed"
    with open(tmp_path / "train.log", "w") as log:  # a file, not a pipe nobody reads while polling
        process = subprocess.Popen(train_command(output_dir, "--save_steps", "1", steps=200), env=environment(),
                                   stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    deadline, caught = time.time() + 240, None
    try:
        while caught is None:
            assert process.poll() is None and time.time() < deadline, (tmp_path / "train.log").read_text()[-3000:]
            folders = checkpoint_folders(output_dir)
            newest = folders[0] if len(folders) >= 2 else None
            if newest and (newest / "model.safetensors").exists() and not (newest / COMPLETE_MARKER).exists():
                process.send_signal(signal.SIGSTOP)
                _, status = os.waitpid(process.pid, os.WUNTRACED)  # returns once the process is stopped
                assert os.WIFSTOPPED(status), f"the run ended (status {status}) before it was stopped"
                if not (newest / COMPLETE_MARKER).exists():
                    caught = newest  # killed just below, in the middle of saving it
                else:  # it finished that checkpoint before it stopped: try the next one
                    process.send_signal(signal.SIGCONT)
            time.sleep(0.001)
    finally:
        process.kill()  # caught, or the test failed: the run ends here either way
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL

    folders = checkpoint_folders(output_dir)
    assert folders[0] == caught and (caught / "model.safetensors").exists()
    assert not (caught / COMPLETE_MARKER).exists()
    previous = folders[1]
    assert (previous / COMPLETE_MARKER).exists()
    capsys.readouterr()
    assert resolve_resume_checkpoint("true", str(output_dir)) == str(previous)
    said = capsys.readouterr().err
    assert f"skipping {caught.name}: incomplete (no {COMPLETE_MARKER}" in said, said
    assert f"resuming from {previous} (the newest complete checkpoint)" in said, said


def test_resuming_off_a_generation_boundary_warns(full_run):
    """TRL regenerates every steps_per_generation * num_iterations micro-steps; checkpoint-2 of a run generating every
    4 steps resumes mid-buffer (warned), of one generating every 2 steps at a boundary (silent)."""
    import warnings
    from types import SimpleNamespace

    from sharpgrpo.run.lifecycle import warn_if_off_boundary

    checkpoint = str(full_run / "checkpoint-2")
    every = lambda n: SimpleNamespace(steps_per_generation=n, gradient_accumulation_steps=1, num_iterations=1)
    with pytest.warns(UserWarning, match="step 2.*not at a generation boundary"):
        warn_if_off_boundary(checkpoint, every(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_off_boundary(checkpoint, every(2))


def test_strategy_state_loads_with_weights_only(tmp_path):
    """The `random` strategy's generator state (a uint8 tensor), ints and dicts round-trip under weights_only=True,
    and the generator continues the same stream."""
    from _launch_worker import build_config

    from sharpgrpo.strategies import STRATEGIES

    args = build_config(str(tmp_path), strategies="random")
    strategy = STRATEGIES.get("random")(args)
    logps, mask = torch.zeros(3, 5), torch.ones(3, 5)
    strategy.weights(logps, mask)
    saved = {"strategies": {"RandomWeights": strategy.state_dict()}, "generation_count": 7}
    torch.save(saved, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded["generation_count"] == 7
    expected = strategy.weights(logps, mask)
    fresh = STRATEGIES.get("random")(args)
    fresh.load_state_dict(loaded["strategies"]["RandomWeights"])
    assert torch.equal(fresh.weights(logps, mask), expected)


def test_non_finite_gradient_stops_after_saving_the_last_good_state(tiny_model_path, tmp_path):
    """An advantage strategy that blows the advantages up by 1e30 from the third generation batch on: the gradient
    norm overflows at step 3, training stops with an error naming the step and the strategy, and checkpoint-2 holds
    the finite weights of step 2 (not updated by the overflowing step)."""
    from _launch_worker import build_config
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset
    from sharpgrpo.strategies import AdvantageStrategy, register_strategy

    @register_strategy("test_blow_up")
    class BlowUp(AdvantageStrategy):
        needs_old_logps = False
        calls = 0

        def token_advantages(self, batch):
            BlowUp.calls += 1
            return batch.advantages * (1e30 if BlowUp.calls >= 3 else 1.0), {}

    output_dir = tmp_path / "out"
    args = build_config(str(output_dir), strategies="test_blow_up", max_steps=5, per_device_train_batch_size=8)
    trainer = SharpGRPOTrainer(
        model=tiny_model_path, reward_funcs=[allowed_letters_reward], args=args, train_dataset=demo_dataset(64),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
    )  # fmt: skip
    with pytest.raises(NonFiniteTrainingError, match=r"Step 3: the gradient norm is (inf|nan).*test_blow_up"):
        trainer.train()
    checkpoint = output_dir / "checkpoint-2"
    assert (checkpoint / COMPLETE_MARKER).exists()
    saved = load_file(checkpoint / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
    live = {k: v for k, v in trainer.model.state_dict().items() if k in saved}
    assert all(torch.equal(live[k], saved[k]) for k in live)  # the optimizer never applied step 3
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 2
    assert not math.isnan(trainer.state.log_history[-1].get("loss", 0.0))
