"""Compare strategies across seeds in one command, with confidence intervals:

    sharpgrpo compare --config configs/demo.yaml --strategies equal grpo_sg cw_grpo thr --seeds 0 1 2 3 4 \\
        --output reports/demo [--jobs 2] [--set max_steps=100 ...] [--eval TASK --eval_limit K]

Every (strategy, seed) is its own ``sharpgrpo train`` run of the same config; only ``strategies``, ``seed``, the strategy
entry's parameters and the ``--set`` overrides differ. Runs go to ``OUTPUT/runs/<strategy>/seed<k>/`` (log:
``train.log``), at most ``--jobs`` at a time, each with ``cores / jobs`` threads. A run that finished (its
``compare_run.json`` marker, written after a successful exit, and ``trainer_state.json`` exist with the same
command and config file contents) is kept and skipped, so an interrupted comparison resumes where it stopped; a run
whose config file or overrides changed since it ran is run again; a crashed run is reported with its log and the
others go on. Ctrl-C (SIGINT), SIGTERM or SIGHUP cancels the queued runs, forwards one SIGINT to the running
``sharpgrpo train`` processes (they save a checkpoint and stop; killed after ``--stop_grace`` seconds), writes the report of
the finished runs and exits with 130; the same command then resumes (interrupted runs start again). Then
``sharpgrpo.compare.stats`` aggregates: per strategy the mean and Student-t interval over seeds, and the paired
difference against the first strategy (the baseline), into ``report.md``, ``summary.json``, ``reward.png``,
``grad_norm.png`` and ``entropy.png`` (mean over seeds with its band).

A strategy entry is ``NAME[+NAME...][:field=value[,field=value...]]``: ``grpo_sg+thr`` composes two strategies,
``thr:thr_p=-0.1`` sets a parameter; its label (``thr (thr_p=-0.1)``) names it in the tables and plots.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from sharpgrpo.compare.report import write_report
from sharpgrpo.compare.runs import (
    NOT_FINISHED,
    Interrupted,
    StrategySpec,
    parse_overrides,
    parse_strategy,
    plan_runs,
    run_all,
    shown_path,
)
from sharpgrpo.run.command_line import check_input_path, check_output_folder
from sharpgrpo.run.config_file import resolve_config_path
from sharpgrpo.validation import ConfigError


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from sharpgrpo.run.command_line import CommandParser
    from sharpgrpo.validation import between, integer, non_negative, positive

    parser = CommandParser(
        prog="sharpgrpo compare",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument(
        "--config", required=True,
        help="The training YAML config every run uses: a path, or a shipped config's name (e.g. demo), as sharpgrpo train takes it.",
    )  # fmt: skip
    parser.add_argument(
        "--strategies", nargs="+", required=True,
        help="Strategy entries, the first is the baseline: NAME, NAME+NAME (composed), NAME:field=value[,...].",
    )  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, required=True, rule=integer(0),
                        help="Seeds; each strategy runs once per seed.")  # fmt: skip
    parser.add_argument("--output", required=True, help="Folder for runs/, report.md, summary.json and the PNGs.")
    parser.add_argument("--jobs", type=int, default=1, rule=integer(1),
                        help="Runs at a time (each gets cores / jobs threads).")  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
        help="Config overrides applied to every run (sharpgrpo train --FIELD VALUE).",
    )  # fmt: skip
    parser.add_argument("--eval", dest="eval_task", default=None, help="After training, run sharpgrpo eval --task.")
    parser.add_argument("--eval_limit", type=int, default=None, rule=integer(1, allow_none=True),
                        help="sharpgrpo eval --limit (problems per group).")  # fmt: skip
    parser.add_argument(
        "--eval_set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
        help="Other sharpgrpo eval options, e.g. n_samples=8 max_new_tokens=8 temperature=1.0.",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, rule=integer(1, allow_none=True),
                        help="Threads per run (default: cores // jobs, >= 1).")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, rule=positive(allow_none=True),
                        help="Seconds after which a run counts as failed.")  # fmt: skip
    parser.add_argument("--spike_factor", type=float, default=3.0, rule=positive(),
                        help="Grad-norm spike: above this x the median.")  # fmt: skip
    parser.add_argument("--confidence", type=float, default=0.95, rule=between(0, 1, low_open=True, high_open=True),
                        help="Interval level (Student t over seeds).")  # fmt: skip
    parser.add_argument(
        "--smooth", type=float, default=0.0, rule=between(0, 1, high_open=True),
        help="Plots only: EMA weight in (0, 1) applied to each run's curve.",
    )  # fmt: skip
    parser.add_argument(
        "--stop_grace", type=float, default=120.0, rule=non_negative(),
        help="On Ctrl-C / SIGTERM: seconds the running training processes get to save a checkpoint and stop before a kill.",
    )  # fmt: skip
    parser.add_argument("--python", default=sys.executable, help="Python interpreter of the runs.")
    parser.add_argument(
        "--report_only", action="store_true",
        help="Run nothing: aggregate the finished runs and list the others as missing (e.g. while a comparison runs).",
    )  # fmt: skip
    try:  # every option, the config with every --set and entry: one line (exit 1) before any run starts
        args = parser.parse_args(argv)
        args.config = resolve_config_path(args.config)  # a path, or a shipped config's name, as train.py takes it
        check_input_path("--config", args.config, "file")

        if len(set(args.seeds)) != len(args.seeds):
            raise ConfigError(f"--seeds={args.seeds}: lists a seed twice.")
        try:
            specs = [parse_strategy(entry) for entry in args.strategies]
            overrides = parse_overrides(args.overrides)
            eval_set = parse_overrides(args.eval_set)
        except ValueError as error:
            raise ConfigError(" ".join(str(error).split())) from None
        labels = [s.label for s in specs]
        if len(set(labels)) != len(labels) or len({s.slug for s in specs}) != len(specs):
            raise ConfigError(f"--strategies={labels}: lists an entry twice.")
        _validate_strategy_names(specs)
        # run.output_dir: the rule of every writer; a comparison continues only with the same config, --set and eval
        settings = {"config": str(Path(args.config).resolve()), "set": [list(o) for o in overrides],
                    "eval": [args.eval_task, args.eval_limit, [list(o) for o in eval_set]]}  # fmt: skip
        check_output_folder("--output", args.output, command="sharpgrpo compare", settings=settings)
        from sharpgrpo.run.output_dir import refuse_if_held

        refuse_if_held(args.output, "--output", "sharpgrpo compare")  # a live comparison there: refused at once

        output = Path(args.output)
        threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
        config = Path(args.config).resolve()
        runs = plan_runs(str(config), specs, args.seeds, output.resolve(), overrides, args.eval_task, args.eval_limit,
                         eval_set)  # fmt: skip
        if not args.report_only:
            check_every_run(runs, specs)  # the config with every --set and every entry, once, before any run starts
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    command = "sharpgrpo compare " + " ".join(argv if argv is not None else sys.argv[1:])
    if os.sep in args.python:  # the runs start in the repository root: a relative interpreter path is from here
        args.python = str(Path(args.python).absolute())
    interrupted = False
    from sharpgrpo.run.output_dir import claim_output_target, hold_output_folder

    try:  # one owner per output folder, for the whole comparison (released when this process ends, however it ends)
        held = hold_output_folder(output, "--output", "sharpgrpo compare")  # noqa: F841
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    claim_output_target(output, command="sharpgrpo compare", settings=settings, config=vars(args),
                        argv=argv)  # every run was checked first
    if args.report_only:
        for run in runs:
            reason = run.stale_reason()
            run.status = "skipped" if reason is None else "missing"
            if reason is not None and reason != NOT_FINISHED:
                run.error = reason
    else:
        previous = _stop_signals_as_keyboard_interrupt()
        try:
            run_all(runs, args.jobs, args.python, threads, args.timeout, args.stop_grace)
        except Interrupted:
            interrupted = True
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    summary = write_report(runs, output, command, args.spike_factor, args.confidence, args.smooth)
    if interrupted:
        stopped = sum(r.status == "interrupted" for r in runs)
        cancelled = sum(r.status == "cancelled" for r in runs)
        finished = sum(r.status in ("done", "skipped") for r in runs)
        print(
            f"Interrupted: stopped {stopped} running run(s), cancelled {cancelled} queued run(s); partial report of "
            f"{finished} finished run(s) in {output / 'report.md'}. Re-run the same command to resume.",
            file=sys.stderr,
        )
        raise SystemExit(130)
    failed = [r for r in runs if r.status == "failed"]
    print(f"Wrote {output / 'report.md'}, {output / 'summary.json'}" + "".join(f", {p}" for p in summary["plots"]))
    if failed:
        print(f"{len(failed)} run(s) failed:", file=sys.stderr)
        for run in failed:
            print(f"  {run.spec.label} seed {run.seed}: {run.error}; log: {shown_path(run.log)}", file=sys.stderr)
    return summary


def _stop_signals_as_keyboard_interrupt() -> dict[int, Any]:
    """Make SIGINT, SIGTERM and SIGHUP stop the comparison like Ctrl-C; return the previous handlers (none off the
    main thread, where handlers cannot be set). SIGINT too: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then raises no KeyboardInterrupt for it (train.py's
    own handler, sharpgrpo.run.lifecycle, is installed the same way)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        raise KeyboardInterrupt

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def _validate_strategy_names(specs: list[StrategySpec]) -> None:
    """Unknown strategy names fail before any run starts (the registry lists the valid ones)."""
    from sharpgrpo.strategies import STRATEGIES

    for spec in specs:
        for name in spec.names:
            try:
                STRATEGIES.get(name)
            except ValueError as error:
                raise ConfigError(f"--strategies {spec.label}: {' '.join(str(error).split())}") from None


def check_every_run(runs, specs: list[StrategySpec]) -> None:
    """Each strategy entry's train.py arguments (the config, every --set, the entry's parameters; one seed stands for
    all) through train.py's own parser and its input checks up to the model (the model source, the reward functions,
    the dataset's name and arguments), so a bad value stops the comparison at once in one line naming the entry,
    instead of every run failing on it one by one."""
    import os

    from sharpgrpo.cli import train
    from sharpgrpo.run.input_checks import check_training_inputs
    saved = dict(os.environ)  # the config's env: block is for the runs, not this process
    try:
        for spec in specs:
            run = next(r for r in runs if r.spec is spec)
            try:
                task, args, model_args = train.parse_arguments(run.train_args)[:3]
                check_training_inputs(task, args, model_args, load_dataset=False)
            except (ConfigError, ValueError) as error:
                raise ConfigError(f"--strategies {spec.label}: {' '.join(str(error).split())}") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # one line per error; --debug or SHARPGRPO_DEBUG=1 for the traceback
        result = main()
    sys.exit(1 if any(r["status"] == "failed" for r in result["runs"]) else 0)
