"""``sharpgrpo train`` (and the repository's ``train.py``): train a policy with SharpGRPOTrainer from a YAML config.

    sharpgrpo train --config demo [--any_field value ...]          # a config shipped with the package, by name
    python train.py --config configs/demo.yaml [--any_field value ...]
    accelerate launch --config_file configs/accelerate/zero3.yaml train.py --config configs/grpo_sg_kk_qwen2.5_3b.yaml

The YAML is flat: every field of `TaskArguments` (below), of `sharpgrpo.SharpGRPOConfig` (all of TRL's
`GRPOConfig` plus the strategies), of TRL's `ModelConfig` (model, dtype, LoRA) and of each registered setting's
arguments (`sharpgrpo.settings`; e.g. the search setting's retrieval server and multi-turn limits, README
"Search"), plus an optional `env:` block of environment variables. Command-line flags override the YAML (TRL's `TrlParser`). Every value and
input is checked before a model loads; an error prints one line (`--debug` or `SHARPGRPO_DEBUG=1` for the full
traceback).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sharpgrpo.run.config_file import apply_config_env

# Only light imports here: the config's `env:` block is applied before transformers, datasets or the Hub client load.
from sharpgrpo.run.errors import exit_together, one_line_errors

if TYPE_CHECKING:
    from trl import ModelConfig

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer


@dataclass
class TaskArguments:
    """What to train on and how it is scored."""

    dataset_name: str = field(
        default="demo",
        metadata={
            "help": "A registered dataset (`--help` lists them), a local .jsonl/.json/.parquet file or "
            "folder, or a Hugging Face Hub id."
        },
    )
    dataset_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments of the dataset builder or loader (a YAML mapping, or JSON on the command "
            "line), e.g. {num_puzzles: 2000, min_people: 3, max_people: 7} for `kk`, or {column_mapping: "
            "{problem: prompt}, prompt_template: math, split: train} for a file or hub dataset."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["allowed_letters"],
        metadata={"help": "Reward functions by registered name (`--help` lists them) or dotted path."},
    )
    plot: bool = field(default=True, metadata={"help": "Write training_curves.png into output_dir at the end."})
    save_completions: bool = field(
        default=False,
        metadata={
            "help": "Write each logged generation batch's prompts, completions, rewards and advantages to "
            "output_dir/completions/completions_<step>.parquet (TRL's `log_completions` files, without its console "
            "tables), as `sharpgrpo tokens --completions` reads them."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train into a non-empty output_dir, replacing the run there: everything in it (checkpoint-N "
            "folders, completions/, weights, logs) is removed first; a folder that holds no training run is refused. "
            "Without it a non-empty output_dir is refused unless the run resumes (resume_from_checkpoint)."
        },
    )
    allow_incomplete_resume: bool = field(
        default=False,
        metadata={
            "help": "Resume from a checkpoint that lacks a piece of its state (optimizer.pt, scheduler.pt, "
            "rng_state.pth, sharpgrpo_strategy_state.pt, or a file its completion marker lists), with a warning "
            "naming what will differ from an uninterrupted run. Without it such a checkpoint is refused, naming the "
            "file."
        },
    )
    print_metrics: bool = field(
        default=False,
        metadata={
            "help": "Print every logged metric dict (transformers' default). Off: the progress bar shows loss and "
            "reward, and one summary line ends the run; every step's metrics are in trainer_state.json."
        },
    )


def main(
    task: TaskArguments,
    training_args: SharpGRPOConfig,
    model_args: ModelConfig,
    *setting_args,
    config_path: str | None = None,
) -> SharpGRPOTrainer:
    """Train with the parsed config; ``setting_args`` are the parsed arguments of the registered settings
    (``sharpgrpo.settings.training_setting_arguments``), one of which may supply the rollout; ``config_path``: the
    config file (an input the output_dir guard never removes)."""
    from sharpgrpo.run.lifecycle import CheckpointError, resolve_resume_checkpoint
    from sharpgrpo.run.output_dir import guard_output_dir
    from sharpgrpo.run.run_output import check_process_count

    check_process_count()
    from sharpgrpo.models.source import check_model_source

    # The model folder (config, weights, tokenizer), a prepared name or a Hub id: before output_dir is touched.
    from sharpgrpo.run.input_checks import checked_model_name, input_paths

    check_model_source(checked_model_name(model_args.model_name_or_path), revision=model_args.model_revision)
    from sharpgrpo.training.generation.routing_replay import check_routing_replay_model

    check_routing_replay_model(model_args.model_name_or_path, training_args)  # a dense model with routing_replay
    try:  # `true` -> the newest complete checkpoint; a named one is checked for damaged files, before the model loads
        training_args.resume_from_checkpoint = resolve_resume_checkpoint(
            training_args.resume_from_checkpoint, training_args.output_dir, training_args,
            allow_missing=task.allow_incomplete_resume,
        )
    except CheckpointError as error:
        raise SystemExit(f"error: {error}") from None
    resuming = training_args.resume_from_checkpoint is not None
    from sharpgrpo.run.input_checks import check_training_inputs

    inputs = check_training_inputs(task, training_args, model_args)  # every input, before output_dir is touched
    from sharpgrpo.training.generation.vllm_checks import check_vllm_request

    check_vllm_request(training_args)  # a vLLM request that cannot work: one line, before output_dir is touched
    with guard_output_dir(training_args.output_dir, resuming=resuming, overwrite=task.overwrite_output_dir,
                          inputs=input_paths(task, training_args, model_args, config_path)):  # fmt: skip
        from sharpgrpo.settings import training_rollout

        with training_rollout(setting_args, training_args.output_dir) as rollout_func:
            return _main(task, training_args, model_args, rollout_func=rollout_func, inputs=inputs,
                         arguments=(task, model_args, *setting_args))


def _main(task, training_args, model_args, rollout_func=None, inputs=None, arguments=()) -> SharpGRPOTrainer:
    from transformers import AutoConfig, AutoTokenizer
    from trl import get_peft_config

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.chat_prompts import warn_if_template_unused
    from sharpgrpo.data.row_checks import check_prompt_lengths, model_context_length
    from sharpgrpo.models.prepared import resolve_model_name
    from sharpgrpo.run.input_checks import check_training_inputs
    from sharpgrpo.run.lifecycle import (
        CheckpointError,
        NonFiniteTrainingError,
        check_resume_compatible,
        final_save_failed,
        lifecycle_callback,
        save_step_log,
        stop_after_error,
        write_failure,
    )
    from sharpgrpo.run.run_output import CompletionsCallback, QuietProgressCallback, training_summary
    from sharpgrpo.validation import ConfigError
    # Inputs are checked before a model is built or loaded (the config checked itself while parsing).
    model_name, reward_funcs, train_dataset = inputs or check_training_inputs(task, training_args, model_args)

    model_path = resolve_model_name(model_name)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    warn_if_template_unused(train_dataset, tokenizer, task.dataset_name, task.dataset_kwargs)
    # before the resume check, which compares the arguments with the saved run's (as they were saved)
    model_init_kwargs = dict(training_args.model_init_kwargs or {})
    if model_args.dtype is not None:
        model_init_kwargs.setdefault("dtype", model_args.dtype)
    if model_args.attn_implementation is not None:
        model_init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    training_args.model_init_kwargs = model_init_kwargs or None

    model_config = AutoConfig.from_pretrained(model_path, revision=model_args.model_revision).to_dict()
    try:  # a checkpoint of another architecture, before load_state_dict would fail on it; other settings warn
        check_resume_compatible(training_args.resume_from_checkpoint, training_args, model_config)
    except CheckpointError as error:
        raise ConfigError(str(error)) from None
    check_prompt_lengths(  # every prompt as TRL renders it, against the model's context: before the model loads
        train_dataset, tokenizer, model_context_length(model_path, model_args.model_revision),
        training_args.max_completion_length, f"dataset_name={task.dataset_name!r}", training_args.chat_template_kwargs,
    )  # fmt: skip

    trainer = SharpGRPOTrainer(
        model=model_name,  # as given: the trainer resolves a prepared name and names it on a saved adapter
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        rollout_func=rollout_func,
    )
    trainer.base_model_name = model_name  # named on the model card
    # the run record's config: the training arguments plus the task's, the model's and the settings' (run.run_record)
    trainer.run_arguments = {type(a).__name__: dataclasses.asdict(a) for a in arguments if dataclasses.is_dataclass(a)}
    if task.save_completions:
        trainer.add_callback(CompletionsCallback(trainer))
    from sharpgrpo.diagnostics.trackers import ARTIFACT_TRACKERS, TelemetryTrackerCallback

    if training_args.token_telemetry and set(training_args.report_to or []) & set(ARTIFACT_TRACKERS):
        trainer.add_callback(TelemetryTrackerCallback(trainer))  # each telemetry step's page and completions
    if not task.print_metrics:
        QuietProgressCallback.install(trainer)
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    except NonFiniteTrainingError as error:
        _save_logs_and_plot(trainer, task)
        raise SystemExit(f"error: {error}") from None
    except (Exception, SystemExit, KeyboardInterrupt) as error:  # any other error, user code ending the process:
        stopper = lifecycle_callback(trainer)  # the last good weights and optimizer, the logs and the plot
        if isinstance(error, KeyboardInterrupt) and stopper is not None and stopper.signal_received:
            raise  # a second Ctrl-C: stop at once, as the first one said
        stopped = stop_after_error(trainer, error)
        try:
            _save_logs_and_plot(trainer, task)
        except Exception as save_error:  # noqa: BLE001 - keep the training error as the one reported
            print(f"[sharpgrpo] writing trainer_state.json or the plot into {training_args.output_dir} failed: "
                  f"{write_failure(save_error, training_args.output_dir)}", file=sys.stderr)  # fmt: skip
        if stopped.everywhere and trainer.accelerator.num_processes > 1:  # all processes stopped on it together
            exit_together(stopped, trainer.is_world_process_zero(), trainer.accelerator.wait_for_everyone)
        raise stopped from error
    stopper = lifecycle_callback(trainer)
    if stopper is not None and stopper.stopped_by_signal:  # SIGINT/SIGTERM: checkpoint saved at the step's end
        _save_logs_and_plot(trainer, task)
        if trainer.is_world_process_zero():
            print(training_summary(trainer, interrupted=True), file=sys.stderr)
        raise SystemExit(128 + int(stopper.signal_received))

    started = time.time() - 1  # file times can be a second coarse
    try:
        trainer.save_model(training_args.output_dir)  # final weights (or adapters) + tokenizer + model card
        save_step_log(trainer)  # full log history in output_dir/trainer_state.json
    except Exception as error:  # a full disk: the folder and cause, the step log and the last complete checkpoint
        raise final_save_failed(trainer, error, started) from error
    if trainer.is_world_process_zero():
        trainer.create_model_card(dataset_name=task.dataset_name)
        if task.plot:
            from sharpgrpo.diagnostics.curve_plots import plot_training_curves

            output_dir = training_args.output_dir
            plot_training_curves(output_dir, os.path.join(output_dir, "training_curves.png"))
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=task.dataset_name)
    if trainer.is_world_process_zero():
        print(training_summary(trainer), file=sys.stderr)
    return trainer


def _save_logs_and_plot(trainer: SharpGRPOTrainer, task: TaskArguments) -> None:
    """After a stop: every step's logs (output_dir/trainer_state.json) and the curves so far."""
    from sharpgrpo.run.lifecycle import save_step_log

    save_step_log(trainer)
    if trainer.is_world_process_zero() and task.plot and trainer.state.log_history:
        from sharpgrpo.diagnostics.curve_plots import plot_training_curves

        output_dir = trainer.args.output_dir
        plot_training_curves(output_dir, os.path.join(output_dir, "training_curves.png"))


def cli(args: list[str] | None = None) -> None:
    args = sys.argv[1:] if args is None else args
    # transformers 5 renamed gradient_checkpointing* to activation_checkpointing*; TRL's GRPOConfig default
    # (gradient_checkpointing=True) and TRL's trainer still use the old names, so every run warned, ahead of a
    # one-line error too, about something the user did not write.
    warnings.filterwarnings("ignore", message=r"`\w*gradient_checkpointing\w*` is deprecated", category=FutureWarning)
    with one_line_errors(args):  # an error prints one line; --debug or SHARPGRPO_DEBUG=1 shows the traceback
        apply_config_env(args)  # before transformers and datasets are imported: they read it once, on import
        from sharpgrpo.run.config_file import config_path_from_args

        main(*parse_arguments(args), config_path=config_path_from_args(args))


def parse_arguments(args: list[str]) -> tuple:
    """``(TaskArguments, SharpGRPOConfig, ModelConfig, *setting arguments)`` from a config and command-line flags,
    through train.py's parser (:class:`sharpgrpo.run.config_parser.ConfigParser`): the config checks itself here."""
    import argparse

    from trl import ModelConfig

    from sharpgrpo import SharpGRPOConfig
    from sharpgrpo.run.config_file import CONFIG_FLAG, config_path_from_args, shipped_config_names
    from sharpgrpo.run.config_parser import ConfigParser, train_command
    from sharpgrpo.settings import training_setting_arguments
    from sharpgrpo.validation import ConfigError

    parser = ConfigParser(
        (TaskArguments, SharpGRPOConfig, ModelConfig, *training_setting_arguments()), prog=train_command(),
        description="Train a policy with SharpGRPOTrainer from a YAML config; every field below is also a flag that "
        "overrides the config's value.",
    )  # fmt: skip
    # Read by the parser before argparse sees the flags (sharpgrpo.run.config_parser); declared here for --help only
    # (SUPPRESS: it never reaches the parsed dataclasses).
    config = parser.add_argument(
        CONFIG_FLAG, default=argparse.SUPPRESS, metavar="CONFIG",
        help=f"The YAML config: a file, or a shipped config's name ({', '.join(shipped_config_names())}).",
    )  # fmt: skip
    for actions in (parser._actions, parser._optionals._group_actions):  # listed first, after -h, not 1,700 lines down
        actions.remove(config)
        actions.insert(1, config)
    if any(a in ("-h", "--help") for a in args):  # the registered names, from the registries (settings add theirs)
        from reward_fns import REWARD_FUNCTIONS

        from sharpgrpo.data.registry import DATASETS

        for dest, registry in (("dataset_name", DATASETS), ("reward_funcs", REWARD_FUNCTIONS)):
            action = next(a for a in parser._actions if a.dest == dest)
            action.help = f"{action.help} Registered: {', '.join(registry.names())}."
    if config_path_from_args(list(args)) is not None or any(a in ("-h", "--help") for a in args):
        return tuple(parser.parse_args_and_config(list(args)))
    if not args:
        raise ConfigError(f"{train_command()} needs {CONFIG_FLAG}: a YAML file or a shipped config's name, e.g. "
                          f"`{train_command()} {CONFIG_FLAG} demo` (shipped: {', '.join(shipped_config_names())}); "
                          f"see {train_command()} --help.")  # fmt: skip
    try:  # flags only: allowed, but TRL's defaults (bf16 on a GPU, ...) then apply; say that no config was read
        parsed = tuple(parser.parse_args_and_config(list(args)))
    except (ConfigError, ValueError) as error:
        raise ConfigError(f"{' '.join(str(error).split())} (no {CONFIG_FLAG} was given, so TRL's defaults apply; "
                          f"`{CONFIG_FLAG} demo` starts from the CPU demo)") from None
    return parsed


if __name__ == "__main__":
    cli()
