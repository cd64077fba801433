"""Nothing lost: interrupts, resume, checkpoint integrity and the non-finite stop (TrainerCallbacks + helpers).

* **SIGINT / SIGTERM** (Ctrl-C, cluster preemption) during ``train()``: the current optimizer step finishes,
  training continues to the next generation boundary (at most ``steps_per_generation * num_iterations`` micro-steps;
  on every step with the defaults) so that the checkpoint resumes exactly, saves a checkpoint there and stops;
  ``train.py`` then writes ``trainer_state.json`` and the plot and exits with ``128 + signal``. A second signal
  interrupts at once (Python's default handler).
* **Complete checkpoints only.** Each checkpoint gets a marker file (:data:`COMPLETE_MARKER`) after every process
  has written its files; ``resume_from_checkpoint=True`` (CLI ``--resume_from_checkpoint true``) picks the newest
  checkpoint with the marker, skips (and names) newer ones without it (a run killed while saving), and says which
  one it uses. A named checkpoint is checked first: a truncated ``trainer_state.json``, ``*.safetensors`` or
  ``torch.save`` file (optimizer, scheduler, random and strategy states) is reported by name before the model loads.
* **Generation boundary.** TRL does not checkpoint its buffered generation batch, so a checkpoint whose step is not
  a multiple of the generation period resumes with a fresh batch where the uninterrupted run reused its buffer:
  resuming from one warns.
* **Non-finite loss or gradient.** Before every optimizer step the gradient norm is checked (the norm transformers
  computes anyway; a NaN loss makes it NaN, an overflow infinite); a NaN/inf stops training with :class:`NonFiniteTrainingError`, naming the step and the strategies, after saving the
  weights and optimizer state from before that step as a checkpoint (so NaN weights are never saved as the last good
  state, and no completion is ever sampled from NaN weights).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import struct
import sys
import threading
import traceback
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from sharpgrpo.paths import write_text_atomically

COMPLETE_MARKER = "sharpgrpo_checkpoint_complete"  # written last into each checkpoint folder
TRAINING_ARGS_JSON = "training_args.json"  # readable twin of transformers' pickled training_args.bin
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (missing, incomplete or with a damaged file, named)."""


class NonFiniteTrainingError(RuntimeError):
    """The loss or the gradient became NaN or infinite."""


# ------------------------------------------------------------------------------------------------------------------
# Checkpoint integrity and the resume choice
# ------------------------------------------------------------------------------------------------------------------
def check_safetensors(path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` naming ``path`` if its header is unreadable or the file is shorter than the
    tensors it declares (a write cut short)."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len > size - 8:
                raise ValueError(f"header of {header_len} bytes in a file of {size}")
            header = json.loads(handle.read(header_len))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file ({error}); it was probably cut short.") from None
    if 8 + header_len + end > size:
        raise CheckpointError(
            f"{path} is truncated: its header declares {8 + header_len + end} bytes, the file has {size}."
        )


def check_trainer_state(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({error}); it was probably cut short.") from None
    if not isinstance(state, dict) or "global_step" not in state:
        raise CheckpointError(f"{path} is not a trainer state (no `global_step`).")
    return state


def check_checkpoint(checkpoint: str | os.PathLike, allow_missing: bool = False) -> dict:
    """Check a checkpoint folder: it is one (not a run's output_dir or a model folder), every piece of its state is
    there (:func:`missing_pieces`) and no file is damaged; return the trainer state. Raises :class:`CheckpointError`
    naming the first missing or damaged file; ``allow_missing`` (``allow_incomplete_resume``) turns a missing piece
    into a warning that says what will differ."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise CheckpointError(f"Checkpoint {checkpoint} does not exist or is not a folder.")
    inside = checkpoint_folders(checkpoint)
    if inside or not (checkpoint / "trainer_state.json").exists():
        hint = (f" it is a run's output_dir: resume from one of its checkpoints ({inside[0].name}, ...) or give "
                "--resume_from_checkpoint true with this output_dir" if inside else
                " a run's checkpoints are its checkpoint-N folders")  # fmt: skip
        raise CheckpointError(f"{checkpoint} is not a checkpoint (no trainer_state.json, or checkpoint-N folders "
                              f"inside it);{hint}.")  # fmt: skip
    state = check_trainer_state(checkpoint / "trainer_state.json")
    for file in sorted(checkpoint.glob("*.safetensors")):
        check_safetensors(file)
    for file in sorted([*checkpoint.glob("*.pt"), *checkpoint.glob("*.pth"), *checkpoint.glob("*.bin")]):
        check_torch_file(file)
    missing = missing_pieces(checkpoint)
    check_checksums(checkpoint)
    if missing:
        what = "; ".join(f"{name} ({why})" for name, why in missing)
        if not allow_missing:
            raise CheckpointError(
                f"{checkpoint} lacks {what}: resuming would not continue the run exactly. Resume from a complete "
                "checkpoint, or accept the difference with --allow_incomplete_resume true."
            )
        warnings.warn(f"allow_incomplete_resume: {checkpoint} lacks {what}; the resumed run differs from an "
                      "uninterrupted one from there on.", stacklevel=2)  # fmt: skip
    return state


# What each piece of a checkpoint restores: transformers writes the first four, sharpgrpo the strategies' state.
_PIECES = (
    ("optimizer.pt", "the optimizer state (Adam's moments): the resumed run would restart them from zero"),
    ("scheduler.pt", "the learning-rate schedule: the resumed run would restart it from step 0"),
    ("rng_state*.pth", "the random streams: the resumed run would sample other completions"),
    ("sharpgrpo_strategy_state*.pt", "the strategies' state and the generation count: they would restart fresh"),
)
_WEIGHTS = ("model.safetensors", "model-*.safetensors", "adapter_model.safetensors", "pytorch_model*.bin",
            "adapter_model.bin", "global_step*", "pytorch_model_fsdp*")  # fmt: skip


def checkpoint_listing(checkpoint: str | os.PathLike, with_checksums: bool = False) -> dict | None:
    """The files (name -> size) the checkpoint's completion marker lists, or None (no marker, or an older one);
    ``with_checksums``: name -> ``(size, sha256 or None)`` (markers written before checksums have none)."""
    try:
        lines = (Path(checkpoint) / COMPLETE_MARKER).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    listed = {}
    for line in lines:
        parts = line.split("\t")
        if len(parts) in (3, 4) and parts[0] == "file" and parts[2].isdigit():
            digest = parts[3].removeprefix("sha256:") if len(parts) == 4 else None
            listed[parts[1]] = (int(parts[2]), digest) if with_checksums else int(parts[2])
    return listed or None


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def check_checksums(checkpoint: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` naming the first file whose content is not what was saved: its sha256 against
    the one the completion marker recorded when the checkpoint was written (a change in place that keeps the size and
    the header, e.g. NaN bytes in the weights or a damaged block of ``optimizer.pt``; ``torch.load`` does not check
    its archive's CRCs). Checkpoints written before checksums are not checked."""
    checkpoint = Path(checkpoint)
    for name, (size, saved) in sorted((checkpoint_listing(checkpoint, with_checksums=True) or {}).items()):
        path = checkpoint / name
        if saved is None or not path.is_file() or path.stat().st_size != size:
            continue  # missing or resized files are missing_pieces' to name
        now = file_sha256(path)
        if now != saved:
            raise CheckpointError(
                f"{path} changed since it was saved: its content checksum (sha256 {now[:16]}...) is not the one "
                f"recorded at save ({saved[:16]}...), so the file is damaged; resume from another checkpoint."
            )


def missing_pieces(checkpoint: str | os.PathLike) -> list[tuple[str, str]]:
    """``(file, why it matters)`` of each piece of state the checkpoint lacks: the files its completion marker lists
    (missing, or of another size), else the pieces every checkpoint holds (weights, optimizer, scheduler, random and
    strategy states)."""
    checkpoint = Path(checkpoint)
    listed = checkpoint_listing(checkpoint)
    if listed is not None:
        missing = []
        for name, size in sorted(listed.items()):
            path = checkpoint / name
            if not path.exists():
                missing.append((name, "listed when it was saved, now missing"))
            elif path.is_file() and path.stat().st_size != size:
                missing.append((name, f"{path.stat().st_size} bytes, {size} when it was saved"))
        return missing
    missing = []
    if not any(any(checkpoint.glob(pattern)) for pattern in _WEIGHTS):
        missing.append(("model.safetensors", "the weights"))
    sharded = any(checkpoint.glob("global_step*")) or any(checkpoint.glob("pytorch_model_fsdp*"))
    for pattern, why in _PIECES:
        if pattern == "optimizer.pt" and (sharded or any(checkpoint.glob("optimizer_*"))):
            continue  # DeepSpeed / FSDP keep the optimizer in their own files
        if not any(checkpoint.glob(pattern)):
            missing.append((pattern.replace("*", ""), why))
    return missing


def check_not_finished(checkpoint: str | os.PathLike, args, output_dir: str | None = None) -> None:
    """Refuse resuming a run that has nothing left to train: its step is at or past ``max_steps`` (transformers would
    still run a step past it and replace the final model), or, training by epochs, the run it belongs to had
    finished its plan and its final model is in ``output_dir``."""
    checkpoint = Path(checkpoint)
    state = check_trainer_state(checkpoint / "trainer_state.json")
    step = int(state["global_step"])
    max_steps = int(getattr(args, "max_steps", -1) or -1)
    if max_steps > 0 and step >= max_steps:
        raise CheckpointError(
            f"resume_from_checkpoint={str(checkpoint)!r} is at step {step} and max_steps={max_steps}: the run has "
            "nothing left to train (resuming would train past max_steps and replace its final model); raise "
            "max_steps to train it further."
        )
    saved_max = int(state.get("max_steps") or 0)
    final = output_dir is not None and any((Path(output_dir) / name).is_file() for name in _FINAL_FILES)
    if max_steps <= 0 and saved_max > 0 and step >= saved_max and final:
        raise CheckpointError(
            f"resume_from_checkpoint={str(checkpoint)!r} is the last step ({step}) of a finished run whose final "
            f"model is in output_dir={output_dir!r}: resuming would replace it. Set max_steps above {step} to train "
            "it further."
        )


_FINAL_FILES = ("model.safetensors", "adapter_model.safetensors")


def check_torch_file(path: Path) -> None:
    """``torch.save`` writes a zip archive whose directory is at its end: a file cut short has none."""
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(f"{path} is damaged or was cut short ({error}).") from None


def checkpoint_folders(output_dir: str | os.PathLike) -> list[Path]:
    """``checkpoint-N`` folders of ``output_dir``, newest (largest N) first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if (m := _CHECKPOINT_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def latest_complete_checkpoint(output_dir: str | os.PathLike) -> tuple[Path | None, list[str]]:
    """``(newest complete checkpoint or None, reasons the newer ones were skipped)``."""
    skipped = []
    for folder in checkpoint_folders(output_dir):
        if not (folder / COMPLETE_MARKER).exists():
            skipped.append(f"{folder.name}: incomplete (no {COMPLETE_MARKER}; the run stopped while saving it)")
            continue
        try:
            check_checkpoint(folder)
        except CheckpointError as error:
            skipped.append(f"{folder.name}: {error}")
            continue
        return folder, skipped
    return None, skipped


def resolve_resume_checkpoint(value: Any, output_dir: str, args=None, allow_missing: bool = False) -> str | None:
    """The checkpoint ``train(resume_from_checkpoint=value)`` should load, checked, or None.

    ``True`` / ``"true"``: the newest complete checkpoint of ``output_dir``; ``False`` / ``None`` / ``"false"``:
    none; a path: that checkpoint, after checking its files (:func:`check_checkpoint`; ``allow_missing``: a missing
    piece of state warns instead). For ``True`` it says on stderr which one it chose. With the run's ``args``, a
    finished run is refused (:func:`check_not_finished`)."""
    checkpoint = _resolve_resume_checkpoint(value, output_dir, allow_missing)
    if checkpoint is not None and args is not None:
        check_not_finished(checkpoint, args, output_dir)
    return checkpoint


def _resolve_resume_checkpoint(value: Any, output_dir: str, allow_missing: bool) -> str | None:
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "none", ""):
        value = value.strip().lower() == "true"
    if value is None or value is False:
        return None
    if value is True:
        checkpoint, skipped = latest_complete_checkpoint(output_dir)
        for reason in skipped:
            print(f"[sharpgrpo] skipping {reason}", file=sys.stderr)
        if checkpoint is None:
            raise CheckpointError(
                f"resume_from_checkpoint=true: no complete checkpoint-N folder in output_dir={output_dir!r}"
                + (f" ({len(skipped)} incomplete or damaged ones skipped)." if skipped else ".")
            )
        print(f"[sharpgrpo] resuming from {checkpoint} (the newest complete checkpoint)", file=sys.stderr)
        return str(checkpoint)
    checkpoint = Path(os.fspath(value))
    check_checkpoint(checkpoint, allow_missing=allow_missing)
    if checkpoint_folders(checkpoint.parent) and not (checkpoint / COMPLETE_MARKER).exists():
        warnings.warn(
            f"{checkpoint} has no {COMPLETE_MARKER} marker: it was saved by another tool or a run that stopped while "
            "saving it; its files look intact, resuming from it.",
            stacklevel=2,
        )
    return str(checkpoint)


_ARCHITECTURE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                      "intermediate_size", "vocab_size")  # fmt: skip


def check_resume_compatible(checkpoint: str | None, args, model_config: dict) -> None:
    """Before the model loads: refuse a checkpoint saved for another architecture (its ``config.json`` against the
    model's, ``model_config``), and warn when it was trained with other settings (its ``training_args.json``,
    :func:`warn_changed_settings`)."""
    if checkpoint is None:
        return
    saved_config = Path(checkpoint) / "config.json"
    if saved_config.is_file():
        saved = json.loads(saved_config.read_text(encoding="utf-8"))
        for key in _ARCHITECTURE_KEYS:
            if key in saved and key in model_config and saved[key] != model_config[key]:
                raise CheckpointError(
                    f"resume_from_checkpoint={checkpoint!r}: saved for another model ({key} {saved[key]!r}; the "
                    f"model being trained has {model_config[key]!r}); resume with the model_name_or_path it was "
                    "trained from."
                )
    saved_args = Path(checkpoint) / TRAINING_ARGS_JSON
    if saved_args.is_file():
        warn_changed_settings(checkpoint, json.loads(saved_args.read_text(encoding="utf-8")), args)


# Fields that say where and how a run is recorded, not what it computes: a resumed run may change them freely.
_RECORDING_FIELDS = {"output_dir", "resume_from_checkpoint", "max_steps", "num_train_epochs", "run_name", "project",
                     "report_to", "disable_tqdm", "local_rank", "debug", "hub_token", "push_to_hub",
                     "num_completions_to_print", "skip_memory_metrics", "telemetry_steps", "token_telemetry",
                     "dump_token_scores", "thr_debug_dump", "generation_capture", "ddp_timeout", "vllm_server_timeout",
                     "dataloader_num_workers", "dataloader_persistent_workers", "dataloader_pin_memory",
                     "dataloader_prefetch_factor", "per_device_eval_batch_size", "num_generations_eval",
                     "load_best_model_at_end", "metric_for_best_model", "greater_is_better", "batch_eval_metrics",
                     "prediction_loss_only", "do_train", "do_eval", "do_predict"}  # fmt: skip
_RECORDING_PREFIXES = ("logging_", "log_", "save_", "hub_", "trackio_", "eval_", "include_", "torch_empty_cache")
# What a changed field makes differ, said beside it (the others change the training computation itself).
_CHANGE_EFFECTS = {"seed": "the prompt order and every sampled completion", "data_seed": "the prompt order",
                   "shuffle_dataset": "the prompt order"}  # fmt: skip


def warn_changed_settings(checkpoint: str, saved: dict, args) -> None:
    """Warn once, naming each field, when the run resuming ``checkpoint`` differs from the run that saved it
    (``saved``: its ``training_args.json``) in a setting that makes the continued run differ from the uninterrupted
    one: the seed or data order (a resume without the original ``--seed`` trains on other prompts), the strategies,
    the learning rate, the batch shape, ... Fields that only say where and how the run is recorded are not compared."""
    from sharpgrpo.run.run_record import json_ready

    now = json_ready(args.to_dict() if hasattr(args, "to_dict") else dict(vars(args)))
    now = json.loads(json.dumps(now, default=str))  # the same encoding as the saved file
    changed = [
        f"{key} {saved[key]!r} -> {now[key]!r}" + (f" ({_CHANGE_EFFECTS[key]})" if key in _CHANGE_EFFECTS else "")
        for key in sorted(set(saved) & set(now))
        if saved[key] != now[key] and key not in _RECORDING_FIELDS and not key.startswith(_RECORDING_PREFIXES)
    ]
    if changed:
        step = check_trainer_state(Path(checkpoint) / "trainer_state.json")["global_step"]
        warnings.warn(
            f"resume_from_checkpoint={checkpoint!r} (step {step}) was saved by a run with other settings: "
            f"{'; '.join(changed)}. The continued run differs from the uninterrupted one from step {step} on; give "
            "the saved values to continue the same run.",
            stacklevel=3,
        )


def generation_period(args) -> int:
    """Micro-steps per TRL generation batch: TRL generates every ``steps_per_generation * num_iterations``
    micro-steps (``GRPOTrainer._prepare_inputs``), and a resumed run generates at its first micro-step."""
    return int(args.steps_per_generation or args.gradient_accumulation_steps) * int(args.num_iterations)


def at_generation_boundary(global_step: int, args) -> bool:
    """Whether a checkpoint at ``global_step`` resumes at the start of a generation batch."""
    return (int(global_step) * int(args.gradient_accumulation_steps)) % generation_period(args) == 0


def warn_if_off_boundary(checkpoint: str | None, args) -> None:
    if checkpoint is None:
        return
    step = int(check_trainer_state(Path(checkpoint) / "trainer_state.json")["global_step"])
    if not at_generation_boundary(step, args):
        warnings.warn(
            f"{checkpoint} (step {step}) is not at a generation boundary (TRL generates every steps_per_generation "
            f"* num_iterations = {generation_period(args)} micro-steps, gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}): TRL does not checkpoint its buffered generation batch, so the "
            "resumed run generates a new one where the uninterrupted run would have reused the buffer, and its "
            "losses will differ from there on. Resume from a checkpoint whose step is a multiple of the period.",
            stacklevel=2,
        )


# ------------------------------------------------------------------------------------------------------------------
# Callbacks
# ------------------------------------------------------------------------------------------------------------------
def write_complete_marker(trainer, checkpoint: str) -> None:
    """Mark ``checkpoint`` complete once every process has written its files (called on every process)."""
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        write_training_args(trainer.args, checkpoint)
        marker = os.path.join(checkpoint, COMPLETE_MARKER)
        files = sorted(p for p in Path(checkpoint).rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
        listing = "".join(
            f"file\t{p.relative_to(checkpoint).as_posix()}\t{p.stat().st_size}\tsha256:{file_sha256(p)}\n"
            for p in files
        )
        write_text_atomically(marker, f"step {trainer.state.global_step}\n{listing}")


class LifecycleCallback(TrainerCallback):
    """Signals, checkpoint markers and the non-finite stop for one trainer (see the module docstring)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.signal_received: int | None = None  # the signal that asked training to stop
        self.stopped_by_signal = False
        self._previous_handlers: dict[int, Any] = {}

    # signals ------------------------------------------------------------------------------------------------------
    def _handle(self, signum, frame):
        self.signal_received = signum
        name = signal.Signals(signum).name
        print(
            f"\n[sharpgrpo] {name} received: finishing the current step, then saving a checkpoint and stopping "
            "(send it again to stop at once, without saving).",
            file=sys.stderr,
            flush=True,
        )
        for sig, handler in self._previous_handlers.items():  # a second signal interrupts at once
            signal.signal(sig, handler)

    def on_train_begin(self, args, state, control, **kwargs):
        self.signal_received, self.stopped_by_signal = None, False
        if self.trainer.accelerator.num_processes > 1:
            settle_collectives_at_exit()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous_handlers[sig] = signal.signal(sig, self._handle)
        if state.is_world_process_zero:
            from sharpgrpo.run.output_dir import TRAIN_COMMAND, folder_entries, read_output_marker, write_output_marker

            os.makedirs(args.output_dir, exist_ok=True)
            if read_output_marker(args.output_dir) is None and not folder_entries(Path(args.output_dir)):
                write_output_marker(args.output_dir, TRAIN_COMMAND)  # a run from Python: the folder is the run's
            write_training_args(args, args.output_dir)
            from sharpgrpo.run.run_record import write_run_record

            config = {**args.to_dict(), **getattr(self.trainer, "run_arguments", {})}  # `sharpgrpo train` sets them
            self.trainer.run_record_path = write_run_record(args.output_dir, TRAIN_COMMAND, config, strategies=True,
                                                            processes=self.trainer.accelerator.num_processes)

    def on_train_end(self, args, state, control, **kwargs):
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def on_step_end(self, args, state, control, **kwargs):
        if not at_generation_boundary(state.global_step, args):
            return control
        signum = self.signal_received or 0
        accelerator = self.trainer.accelerator
        if accelerator.num_processes > 1:  # the processes get the signal at different moments: stop together
            signum = int(accelerator.gather(torch.tensor([signum], device=accelerator.device)).max())
        if signum:
            self.signal_received = signum
            control.should_save = True
            control.should_training_stop = True
            self.stopped_by_signal = True
        return control

    def on_save(self, args, state, control, **kwargs):
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(checkpoint):
            write_complete_marker(self.trainer, checkpoint)
        return control

    # non-finite loss or gradient ----------------------------------------------------------------------------------
    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # The gradient norm transformers has just computed (before clipping), read through the trainer's
        # `_get_grad_norm`: a NaN loss gives NaN gradients, an overflow an infinite norm. The optimizer has not
        # stepped yet, so the weights are still those after the previous step.
        norm = getattr(self.trainer, "last_grad_norm", None)
        if norm is not None and not math.isfinite(float(norm)):
            self._stop_non_finite(state, f"the gradient norm is {float(norm)}", weights_good=True)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        bad = {k: v for k, v in (logs or {}).items()
               if k in ("loss", "grad_norm") and isinstance(v, float) and not math.isfinite(v)}  # fmt: skip
        if bad:
            self._stop_non_finite(state, f"logged {bad}", weights_good=False)
        return control

    def _stop_non_finite(self, state, what: str, weights_good: bool) -> None:
        trainer = self.trainer
        step = state.global_step + (1 if weights_good else 0)
        where = save_last_good_state(trainer, weights_checked=weights_good, all_processes_here=True)
        raise NonFiniteTrainingError(
            f"Step {step}: {what} (strategies {list(trainer.args.strategies)}, loss_type {trainer.args.loss_type!r}, "
            f"learning_rate {trainer.args.learning_rate}); training stopped instead of sampling from NaN weights. "
            f"{where} Lower the learning rate or check the strategy parameters and reward scale."
        )

    def restore_signal_handlers(self) -> None:
        self.on_train_end(None, None, None)


def settle_collectives_at_exit() -> None:
    """Let torch.distributed's worker threads drop the last collectives' tensors before Python finalizes (registered
    once per process, by the first multi-process ``train()``).

    A gloo collective's work object is destroyed on gloo's own thread just after the caller's ``wait()`` returns; its
    tensors hold Python objects, so that thread takes the GIL to drop them. If the main thread reaches interpreter
    finalization first, CPython ends the waiting thread, the unwind passes a ``noexcept`` destructor and the process
    aborts with "terminate called without an active exception" (SIGABRT) although training finished and every file
    was written: about one run in 25 of two CPU processes whose script ends right after ``train()`` (seen under gdb:
    ``~AsyncAllgatherWork`` -> ``decref_pyobject`` -> ``take_gil`` -> ``PyThread_exit_thread``; pybind11 #3274
    describes the class). An ``atexit`` hook runs before finalization starts; sleeping there releases the GIL to
    the waiting thread.
    """
    global _SETTLE_REGISTERED
    if not _SETTLE_REGISTERED:
        import atexit
        import time

        atexit.register(time.sleep, 0.1)
        _SETTLE_REGISTERED = True


_SETTLE_REGISTERED = False


def save_last_good_state(trainer, weights_checked: bool = False, all_processes_here: bool = False,
                         save_failed: bool = False) -> str:
    """Save the weights, optimizer, scheduler and random states of the last finished step as a complete
    ``checkpoint-<step>`` (unless one exists), and return one sentence saying where the last good state is.

    Weights that are no longer finite are not saved. ``all_processes_here``: every process calls this together (a
    stop all processes decide on); otherwise, with several processes, saving would wait for the others forever, so
    only the newest earlier checkpoint is named. A ``checkpoint-<step>`` without its completion marker (a save that
    failed, e.g. on a full disk) is removed, never left looking like a checkpoint; ``save_failed``: the error was that
    save itself, which is not tried again."""
    output_dir = trainer.args.output_dir
    step = trainer.state.global_step

    def earlier(reason: str) -> str:
        latest, _ = latest_complete_checkpoint(output_dir) if os.path.isdir(output_dir) else (None, [])
        return reason + (f"; the last good checkpoint is {latest}." if latest else "; no earlier checkpoint exists.")

    if trainer.accelerator.num_processes > 1 and not all_processes_here:
        return earlier(f"No checkpoint was saved ({trainer.accelerator.num_processes} processes save together)")
    saved = os.path.join(output_dir, f"checkpoint-{step}")
    removed = remove_incomplete_checkpoint(trainer, saved)
    if save_failed:
        return earlier(f"The half-written {saved} was removed" if removed else f"{saved} was not saved")
    if not weights_checked and not all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters()):
        return earlier("The weights are no longer finite, so they were not saved")
    if step == 0:
        return "No step had finished, so there was nothing to save."
    if not (Path(saved) / COMPLETE_MARKER).exists():
        try:
            trainer._save_checkpoint(trainer.model, trial=None)
            write_complete_marker(trainer, saved)
        except Exception as error:  # noqa: BLE001 - e.g. a full disk: say so, keep the original error
            cause = write_failure(error, saved)  # before the half-written folder frees its space
            remove_incomplete_checkpoint(trainer, saved)
            return earlier(f"Saving {saved} failed ({cause}; the half-written folder was removed)")
    return (
        f"The last good state (weights and optimizer after step {step}) is saved in {saved}; once the cause is "
        "fixed, continue with --resume_from_checkpoint true."
    )


def remove_incomplete_checkpoint(trainer, folder: str) -> bool:
    """Remove ``folder``, a checkpoint of this run's current step that has no completion marker (its save failed
    part-way), on the main process; return whether one was removed."""
    if not trainer.is_world_process_zero() or not os.path.isdir(folder) or (Path(folder) / COMPLETE_MARKER).exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def write_failure(error: BaseException, folder: str | os.PathLike) -> str:
    """The cause of a failed write into ``folder`` in words. torch's zip writer says only ``[enforce fail at
    inline_container.cc] unexpected pos ...`` and safetensors ``(os error 28)``: a full disk and the file-size limit
    (``ulimit -f``, EFBIG) are read from the errno when there is one, else from the disk and the limit themselves."""
    import errno
    import resource

    code = getattr(error, "errno", None)
    if code is None and (found := re.search(r"os error (\d+)", str(error))):
        code = int(found.group(1))
    place = Path(folder)
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if code in (errno.ENOSPC, errno.EDQUOT) or (code is None and free < 1 << 20):
        return f"no space left on the disk holding {folder} ({free} bytes free)"
    if code == errno.EFBIG or (code is None and limit != resource.RLIM_INFINITY):
        return f"a file in {folder} reached the file size limit (ulimit -f: {limit} bytes)"
    if code is not None:
        return f"{os.strerror(code)} writing into {folder}"
    return f"{type(error).__name__} writing into {folder}: {' '.join(str(error).split())}"


def _raised_in(error: BaseException, function: str) -> bool:
    return any(frame.name == function for frame in traceback.extract_tb(error.__traceback__))


class TrainingStopped(RuntimeError):
    """Training ended with an error after :func:`save_last_good_state`; the message names both. ``everywhere``:
    every process stopped on it together (`sharpgrpo.training.generation.rank_agreement.ProcessFailure`)."""

    names_itself = True
    everywhere = False


def stop_after_error(trainer, error: BaseException) -> TrainingStopped:
    """The error that ends a run which raised ``error`` during ``train()``, after saving its last good state.

    A checkpoint save that failed (a full disk) is named by its folder and cause; ``SystemExit`` or
    ``KeyboardInterrupt`` raised by user code (a reward function calling ``sys.exit``) by where it was raised."""
    callback = lifecycle_callback(trainer)
    if callback is not None:
        callback.restore_signal_handlers()
    everywhere = bool(getattr(error, "everywhere", False))  # all processes raised it together: they save together
    step = trainer.state.global_step
    folder = os.path.join(trainer.args.output_dir, f"checkpoint-{step}")
    save_failed = _raised_in(error, "_save_checkpoint") and not (Path(folder) / COMPLETE_MARKER).exists()
    cause = write_failure(error, folder) if save_failed else ""  # before the half-written folder frees its space
    where = save_last_good_state(trainer, all_processes_here=everywhere, save_failed=save_failed)
    if save_failed:
        what = f"training stopped after step {step}: saving checkpoint-{step} failed: {cause}"
    elif isinstance(error, (SystemExit, KeyboardInterrupt)):
        frame = traceback.extract_tb(error.__traceback__)[-1]
        code = f"({error.code!r})" if isinstance(error, SystemExit) else ""
        what = (f"training stopped at step {step + 1} by {type(error).__name__}{code} raised in {frame.filename}:"
                f"{frame.lineno} ({frame.name}), not by sharpgrpo")  # fmt: skip
    else:
        message = " ".join(str(error).split()).rstrip(".") or repr(error)
        what = f"training stopped at step {step + 1} by {type(error).__name__}: {message}"
    stopped = TrainingStopped(f"{what}. {where}")
    stopped.everywhere = everywhere
    return stopped


def save_step_log(trainer) -> None:
    """``output_dir/trainer_state.json`` (every logged step), written atomically: a full disk leaves the earlier file
    or none, never a truncated one (transformers' ``save_state`` writes in place)."""
    if trainer.is_world_process_zero():
        import dataclasses

        text = json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n"
        write_text_atomically(os.path.join(trainer.args.output_dir, "trainer_state.json"), text)


def final_save_failed(trainer, error: BaseException, started: float) -> TrainingStopped:
    """The error that ends a run whose final save into ``output_dir`` failed (``started``: when it began): the weight
    files it cut short are removed, the step log is kept when it can be written, and the line names the folder,
    the cause and the last complete checkpoint."""
    output_dir = trainer.args.output_dir
    cause = write_failure(error, output_dir)
    removed = []
    for path in sorted(Path(output_dir).glob("*.safetensors")) if trainer.is_world_process_zero() else []:
        if path.stat().st_mtime >= started:
            try:
                check_safetensors(path)
            except CheckpointError:  # cut short by the failed write: not left looking like a final model
                path.unlink()
                removed.append(path.name)
    try:
        save_step_log(trainer)
        log = f"the step log is in {os.path.join(output_dir, 'trainer_state.json')}"
    except OSError as log_error:
        log = f"writing the step log failed too ({write_failure(log_error, output_dir)})"
    latest, _ = latest_complete_checkpoint(output_dir)
    state = f"the last complete checkpoint is {latest}" if latest else "no checkpoint was saved (save_strategy)"
    gone = f"; the half-written {', '.join(removed)} removed" if removed else ""
    return TrainingStopped(
        f"training finished {trainer.state.global_step} steps but saving the final model into {output_dir} failed: "
        f"{cause}{gone}; {log}; {state}."
    )


def lifecycle_callback(trainer) -> LifecycleCallback | None:
    return next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, LifecycleCallback)), None)


def write_training_args(args, folder: str) -> None:
    """``folder/training_args.json``: the run's arguments as JSON (any mapping key written as a string)."""
    from sharpgrpo.run.run_record import json_ready

    with open(os.path.join(folder, TRAINING_ARGS_JSON), "w", encoding="utf-8") as handle:
        json.dump(json_ready(args.to_dict()), handle, indent=2, sort_keys=True)
