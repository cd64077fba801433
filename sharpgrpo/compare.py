"""Compare strategies across seeds in one command, with confidence intervals:

    python -m sharpgrpo.compare --config configs/demo.yaml --strategies equal grpo_sg cw_grpo thr --seeds 0 1 2 3 4 \\
        --output reports/demo [--jobs 2] [--set max_steps=100 ...] [--eval TASK --eval_limit K]

Every (strategy, seed) is its own ``train.py`` run of the same config; only ``strategies``, ``seed``, the strategy
entry's parameters and the ``--set`` overrides differ. Runs go to ``OUTPUT/runs/<strategy>/seed<k>/`` (log:
``train.log``), at most ``--jobs`` at a time, each with ``cores / jobs`` threads. A run that finished (its
``compare_run.json`` marker, written after a successful exit, and ``trainer_state.json`` exist with the same
command and config file contents) is kept and skipped, so an interrupted comparison resumes where it stopped; a run
whose config file or overrides changed since it ran is run again; a crashed run is reported with its log and the
others go on. Ctrl-C (SIGINT), SIGTERM or SIGHUP cancels the queued runs, forwards one SIGINT to the running
``train.py`` processes (they save a checkpoint and stop; killed after ``--stop_grace`` seconds), writes the report of
the finished runs and exits with 130; the same command then resumes (interrupted runs start again). Then
``sharpgrpo.compare_stats`` aggregates: per strategy the mean and Student-t interval over seeds, and the paired
difference against the first strategy (the baseline), into ``report.md``, ``summary.json``, ``reward.png`` and
``grad_norm.png`` (mean over seeds with its band).

A strategy entry is ``NAME[+NAME...][:field=value[,field=value...]]``: ``grpo_sg+thr`` composes two strategies,
``thr:thr_p=-0.1`` sets a parameter; its label (``thr (thr_p=-0.1)``) names it in the tables and plots.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharpgrpo.compare_stats import METRICS, curve_band, run_metrics, summarize
from sharpgrpo.diagnostics.curves import TRAINER_STATE, load_log_history, metric_series
from sharpgrpo.evaluation.report import markdown_table
from sharpgrpo.plot import ema

REPO_ROOT = Path(__file__).resolve().parents[1]
MARKER = "compare_run.json"
NOT_FINISHED = "not finished"  # Run.stale_reason() of a run with no marker (never ran, or did not finish)
LOG = "train.log"


@dataclass(frozen=True)
class StrategySpec:
    """One strategy entry of the comparison: strategy names (composed) and parameter overrides."""

    names: tuple[str, ...]
    params: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        base = "+".join(self.names)
        if not self.params:
            return base
        return f"{base} ({', '.join(f'{k}={v}' for k, v in self.params)})"

    @property
    def slug(self) -> str:
        """A folder name for the label."""
        text = "+".join(self.names) + "".join(f"__{k}={v}" for k, v in self.params)
        return re.sub(r"[^A-Za-z0-9._=+-]", "_", text)


def parse_strategy(entry: str) -> StrategySpec:
    """``grpo_sg``, ``grpo_sg+thr``, ``thr:thr_p=-0.1`` or ``thr:thr_p=-0.1,thr_beta=2`` as a :class:`StrategySpec`."""
    names_part, colon, params_part = entry.partition(":")
    names = tuple(n.strip() for n in names_part.split("+"))
    if not names_part.strip() or any(not n for n in names):
        raise ValueError(f"Strategy entry {entry!r} has an empty strategy name (expected NAME[+NAME][:field=value]).")
    params = []
    if colon and not params_part.strip():
        raise ValueError(f"Strategy entry {entry!r} ends with ':' but sets no parameter (expected field=value).")
    if params_part:
        for item in params_part.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ValueError(f"Strategy entry {entry!r}: parameter {item!r} is not field=value.")
            params.append((key.strip(), value.strip()))
    return StrategySpec(names, tuple(params))


def parse_overrides(items: list[str]) -> list[tuple[str, str]]:
    """``--set field=value`` items as pairs; ``strategies``, ``seed`` and ``output_dir`` belong to the comparison."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise ValueError(f"--set {item!r} is not field=value.")
        if key in ("strategies", "seed", "output_dir"):
            raise ValueError(
                f"--set {key}=... is set by the comparison itself (use --strategies / --seeds / --output)."
            )
        pairs.append((key, value))
    return pairs


@dataclass
class Run:
    spec: StrategySpec
    seed: int
    directory: Path
    train_args: list[str]
    eval_args: list[str] | None = None
    config_hash: str | None = None  # sha256 of the config file's contents and the overrides (see config_hash())
    # pending | done | skipped (finished earlier) | failed | missing (--report_only) | interrupted (stopped by
    # Ctrl-C / SIGTERM while running) | cancelled (queued when the comparison was stopped, never started)
    status: str = "pending"
    error: str | None = None
    seconds: float | None = None
    log: Path = field(init=False)

    def __post_init__(self):
        self.log = self.directory / LOG

    @property
    def eval_output(self) -> Path | None:
        if self.eval_args is None:
            return None
        return self.directory / "eval.json"

    def stale_reason(self) -> str | None:
        """``None`` when the run finished with this exact command and config; otherwise why it has to run (again)."""
        marker = self.directory / MARKER
        if not marker.is_file() or not (self.directory / TRAINER_STATE).is_file():
            return NOT_FINISHED
        try:
            recorded = json.loads(marker.read_text())
        except json.JSONDecodeError:
            return "unreadable " + MARKER
        if recorded.get("train_args") != self.train_args or recorded.get("eval_args") != self.eval_args:
            return "arguments changed since it ran"
        if recorded.get("config_hash") != self.config_hash:
            return "config file or overrides changed since it ran"
        if self.eval_output is not None and not self.eval_output.is_file():
            return "evaluation missing"
        return None


def config_hash(config: str | os.PathLike, overrides: list[tuple[str, str]], params=()) -> str:
    """sha256 of the config file's bytes and the overrides (``--set`` then the strategy entry's parameters), so that
    editing the config file invalidates the finished runs even though their arguments are unchanged."""
    digest = hashlib.sha256(Path(config).read_bytes())
    digest.update(b"\0" + json.dumps([list(p) for p in [*overrides, *params]]).encode())
    return digest.hexdigest()


def plan_runs(
    config: str, specs: list[StrategySpec], seeds: list[int], output: Path, overrides: list[tuple[str, str]],
    eval_task: str | None = None, eval_limit: int | None = None, eval_set: list[tuple[str, str]] | None = None,
) -> list[Run]:  # fmt: skip
    """One :class:`Run` per (strategy, seed) with its ``train.py`` arguments (config, overrides, then the entry's
    parameters, then strategies, seed and output folder)."""
    runs = []
    for spec in specs:
        for seed in seeds:
            directory = output / "runs" / spec.slug / f"seed{seed}"
            args = ["--config", str(config)]
            for key, value in [*overrides, *spec.params]:
                args += [f"--{key}", value]
            args += ["--strategies", ",".join(spec.names), "--seed", str(seed), "--output_dir", str(directory)]
            # The run folder holds this run's train.log; a run that starts again replaces what an interrupted one left.
            args += ["--plot", "false", "--disable_tqdm", "true", "--overwrite_output_dir", "true"]
            eval_args = None
            if eval_task:
                eval_args = ["--task", eval_task, "--seed", str(seed), "--progress", "false"]
                if eval_limit is not None:
                    eval_args += ["--limit", str(eval_limit)]
                for key, value in eval_set or []:
                    eval_args += [f"--{key}", value]
            runs.append(Run(spec, seed, directory, args, eval_args, config_hash(config, overrides, spec.params)))
    return runs


def _environment(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class Interrupted(Exception):
    """The comparison was stopped (Ctrl-C / SIGTERM) after its running children were stopped."""


class ChildProcesses:
    """The running ``train.py`` / eval processes, and the stop switch that keeps new ones from starting.

    Children get their own session (``start_new_session``) so that a Ctrl-C in the terminal reaches only the
    comparison, which then forwards exactly one SIGINT to each (a second one would abort them before their
    checkpoint)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def start(self, command: list[str], **kwargs) -> subprocess.Popen | None:
        with self.lock:
            if self.stopping.is_set():
                return None
            process = subprocess.Popen(command, start_new_session=True, **kwargs)
            self.running.add(process)
            return process

    def finished(self, process: subprocess.Popen) -> None:
        with self.lock:
            self.running.discard(process)

    def stop(self, grace: float) -> int:
        """Start no new process, SIGINT the running ones, wait up to ``grace`` seconds, then kill the rest; return
        how many were running. A second Ctrl-C during the wait kills at once."""
        with self.lock:
            self.stopping.set()
            processes = list(self.running)
        for process in processes:
            _signal(process, signal.SIGINT)
        deadline = time.monotonic() + grace
        try:
            for process in processes:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:
            pass
        for process in processes:
            if process.poll() is None:
                _signal(process, signal.SIGKILL)
                process.wait()
        return len(processes)


def _signal(process: subprocess.Popen, signum: int) -> None:
    """Signal the child's whole process group (its own session; a DataLoader worker or the eval's children too)."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        try:
            process.send_signal(signum)
        except ProcessLookupError:
            pass


def execute(
    run: Run, python: str, threads: int, timeout: float | None = None, children: ChildProcesses | None = None
) -> Run:
    """Train (then evaluate) one run in a subprocess, logging to ``train.log``; record the outcome in ``run``."""
    children = children or ChildProcesses()
    if children.stopping.is_set():
        run.status = "cancelled"
        return run
    run.directory.mkdir(parents=True, exist_ok=True)
    (run.directory / MARKER).unlink(missing_ok=True)
    started = time.time()
    env = _environment(threads)
    commands = [[python, str(REPO_ROOT / "train.py"), *run.train_args]]
    if run.eval_args is not None:
        commands.append([python, "-m", "sharpgrpo.eval", "--model", str(run.directory), *run.eval_args,
                         "--output", str(run.eval_output)])  # fmt: skip
    with open(run.log, "w", encoding="utf-8") as log:
        for command in commands:
            log.write("$ " + " ".join(command) + "\n")
            log.flush()
            process = children.start(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
            if process is None:
                run.status, run.error = "interrupted", "the comparison was stopped"
                break
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.wait()
                run.status, run.error = "failed", f"timed out after {timeout} s"
                break
            finally:
                children.finished(process)
            if code != 0 and children.stopping.is_set():
                run.status, run.error = "interrupted", f"stopped by the comparison (exit code {code})"
                break
            if code != 0:
                run.status, run.error = "failed", f"exit code {code} of {Path(command[1]).name} {command[2]}"
                break
    run.seconds = time.time() - started
    if run.status == "pending":
        if not (run.directory / TRAINER_STATE).is_file():
            run.status, run.error = "failed", f"exited normally but wrote no {TRAINER_STATE}"
        else:
            run.status = "done"
            marker = {"train_args": run.train_args, "eval_args": run.eval_args, "config_hash": run.config_hash,
                      "seconds": run.seconds}  # fmt: skip
            (run.directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return run


def run_all(
    runs: list[Run], jobs: int, python: str, threads: int, timeout: float | None = None, stop_grace: float = 120.0
) -> list[Run]:
    """Execute the runs that are not finished, ``jobs`` at a time, with a progress bar; return all runs.

    On Ctrl-C (KeyboardInterrupt, also raised for SIGTERM by :func:`main`) the queued runs are cancelled, the running
    ones stopped (:meth:`ChildProcesses.stop`), and :class:`Interrupted` is raised once the statuses are set."""
    from tqdm.auto import tqdm

    todo = []
    for run in runs:
        reason = run.stale_reason()
        if reason is None:
            run.status = "skipped"
        else:
            if reason != NOT_FINISHED:  # it finished before, under other settings
                print(f"{run.spec.label} seed {run.seed}: {reason}; running it again.", file=sys.stderr)
            todo.append(run)
    children = ChildProcesses()
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), unit="run", desc="compare")
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = {}
    try:
        with bar:
            futures = {pool.submit(execute, run, python, threads, timeout, children): run for run in todo}
            for future in as_completed(futures):
                run = futures[future]
                try:
                    future.result()
                except Exception as error:  # noqa: BLE001 - one broken run must not stop the others
                    run.status, run.error = "failed", repr(error)
                if run.status == "failed":
                    bar.write(f"FAILED {run.spec.label} seed {run.seed}: {run.error}; log: {_shown(run.log)}")
                bar.set_postfix(failed=sum(r.status == "failed" for r in runs))
                bar.update(1)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        children.stop(stop_grace)
        pool.shutdown(wait=True)  # the workers return once their child is gone
        for future, run in futures.items():
            if not future.cancelled() and future.exception() is not None:
                run.status, run.error = "failed", repr(future.exception())
        for run in todo:
            if run.status == "pending":  # queued, never started
                run.status, run.error = "cancelled", None
        raise Interrupted() from None
    pool.shutdown(wait=True)
    return runs


# ----------------------------------------------------------------------------------------------------------------
# Aggregation and report
# ----------------------------------------------------------------------------------------------------------------
def collect(runs: list[Run], spike_factor: float) -> tuple[dict[str, dict[int, dict]], dict[str, dict[int, list]]]:
    """``({label: {seed: run_metrics}}, {label: {seed: log_history}})`` of the finished runs."""
    per_run: dict[str, dict[int, dict]] = {}
    histories: dict[str, dict[int, list]] = {}
    for run in runs:
        per_run.setdefault(run.spec.label, {})
        histories.setdefault(run.spec.label, {})
        if run.status not in ("done", "skipped"):
            continue
        history = load_log_history(run.directory)
        eval_result = (
            json.loads(run.eval_output.read_text()) if run.eval_output and run.eval_output.is_file() else None
        )
        per_run[run.spec.label][run.seed] = run_metrics(history, eval_result, spike_factor)
        histories[run.spec.label][run.seed] = history
    return per_run, histories


def _shown(path: Path) -> str:
    """A path relative to the working directory when it lies below it (reports carry no machine paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _number(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}g}"


def _interval(stats: dict[str, Any]) -> str:
    if stats["mean"] is None:
        return "-"
    if stats["low"] is None:
        return f"{_number(stats['mean'])} (n={stats['n']})"
    return f"{_number(stats['mean'])} [{_number(stats['low'])}, {_number(stats['high'])}]"


def report_markdown(summary: dict[str, Any], runs: list[Run], command: str) -> str:
    """``report.md``: the command, the runs, the per-strategy table and the paired-difference table."""
    confidence = round(100 * summary["confidence"])
    names = summary["metrics"]
    titles = {n: METRICS[n][0] if n in METRICS else n for n in names}
    lines = [
        "# Strategy comparison",
        "",
        f"Command: `{command}`",
        "",
        (
            f"Per strategy: mean over seeds [{confidence}% Student-t interval]. Baseline for paired differences: "
            f"**{summary['baseline']}**. Spikes: grad norm above {summary['spike_factor']:g} x the run's median."
        ),
        "",
    ]
    failed = [r for r in runs if r.status == "failed"]
    missing = [r for r in runs if r.status == "missing"]
    stopped = [r for r in runs if r.status in ("interrupted", "cancelled")]
    lines += [f"Runs: {len(runs)} planned, {sum(r.status == 'done' for r in runs)} run now, "
              f"{sum(r.status == 'skipped' for r in runs)} reused, {len(failed)} failed"
              + (f", {len(missing)} not run (--report_only)" if missing else "")
              + (f", {len(stopped)} stopped (interrupted)" if stopped else "") + ".", ""]  # fmt: skip
    if missing:
        lines += ["Not run: " + ", ".join(f"{r.spec.label} seed {r.seed}" + (f" ({r.error})" if r.error else "")
                                          for r in missing), ""]  # fmt: skip
    if stopped:
        lines += [
            "**Partial report: the comparison was interrupted.** Stopped while running: "
            + (", ".join(f"{r.spec.label} seed {r.seed}" for r in stopped if r.status == "interrupted") or "none")
            + "; never started: "
            + (", ".join(f"{r.spec.label} seed {r.seed}" for r in stopped if r.status == "cancelled") or "none")
            + ". Re-running the same command resumes (finished runs are reused).",
            "",
        ]
    if failed:
        lines += ["Failed runs (left out of the statistics):", ""]
        lines += [f"- {r.spec.label} seed {r.seed}: {r.error} (log: `{_shown(r.log)}`)" for r in failed]
        lines.append("")
    lines += ["## Per strategy", ""]
    headers = ["Strategy", "Seeds"] + [titles[n] for n in names]
    rows = [
        [label, len(entry["seeds"])] + [_interval(entry["metrics"][n]) for n in names]
        for label, entry in summary["strategies"].items()
    ]
    lines += [markdown_table(headers, rows), ""]
    if summary["differences"]:
        lines += [
            f"## Paired difference vs {summary['baseline']}",
            "",
            (
                f"Strategy minus baseline on the same seed: mean [{confidence}% interval], then wins / paired seeds "
                "(a win is a better value: higher reward, accuracy and entropy; lower grad norm, CV, spikes and time)."
            ),
            "",
        ]
        headers = ["Strategy"] + [titles[n] for n in names]
        rows = []
        for label, differences in summary["differences"].items():
            cells = []
            for n in names:
                d = differences[n]
                cells.append("-" if d["n"] == 0 else f"{_interval(d)}; {d['wins']}/{d['n']}")
            rows.append([label] + cells)
        lines += [markdown_table(headers, rows), ""]
    return "\n".join(lines)


def plot_bands(
    histories: dict[str, dict[int, list]], key: str, path: Path, title: str, confidence: float, smooth: float = 0.0
) -> bool:
    """Mean over seeds per step with its Student-t band, one line per strategy (``sharpgrpo.plot`` conventions);
    ``smooth`` in (0, 1) first smooths each run's curve with ``sharpgrpo.plot.ema`` (0: raw values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8.0, 4.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = False
    for index, (label, runs) in enumerate(histories.items()):
        series = [metric_series(history, key) for history in runs.values()]
        series = [s for s in series if s[0]]
        if 0 < smooth < 1:
            series = [(steps, ema(values, smooth)) for steps, values in series]
        steps, means, lows, highs = curve_band(series, confidence)
        if not steps:
            continue
        color = colors[index % len(colors)]
        ax.plot(steps, means, color=color, linewidth=1.4, label=f"{label} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(steps, lows, highs, color=color, alpha=0.2, linewidth=0)
        drawn = True
    if drawn:
        note = f", EMA {smooth:g} per run" if 0 < smooth < 1 else ""
        ax.set_title(f"{title}: mean over seeds, {round(100 * confidence)}% band{note}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def write_report(
    runs: list[Run], output: Path, command: str, spike_factor: float = 3.0, confidence: float = 0.95,
    smooth: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """Aggregate the finished runs into ``summary.json``, ``report.md`` and the band plots; return the summary."""
    per_run, histories = collect(runs, spike_factor)
    baseline = runs[0].spec.label
    summary = summarize(per_run, baseline, confidence)
    summary["spike_factor"] = spike_factor
    summary["command"] = command
    summary["runs"] = [
        {"strategy": r.spec.label, "seed": r.seed, "status": r.status, "directory": _shown(r.directory),
         "log": _shown(r.log), "error": r.error, "metrics": per_run.get(r.spec.label, {}).get(r.seed)}
        for r in runs
    ]  # fmt: skip
    output.mkdir(parents=True, exist_ok=True)
    (output / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (output / "report.md").write_text(report_markdown(summary, runs, command))
    plots = []
    for key, title in (("reward", "Reward"), ("grad_norm", "Gradient norm")):
        if plot_bands(histories, key, output / f"{key}.png", title, confidence, smooth):
            plots.append(str(output / f"{key}.png"))
    summary["plots"] = plots
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--config", required=True, help="The train.py YAML config every run uses.")
    parser.add_argument(
        "--strategies", nargs="+", required=True,
        help="Strategy entries, the first is the baseline: NAME, NAME+NAME (composed), NAME:field=value[,...].",
    )  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, required=True, help="Seeds; each strategy runs once per seed.")
    parser.add_argument("--output", required=True, help="Folder for runs/, report.md, summary.json and the PNGs.")
    parser.add_argument("--jobs", type=int, default=1, help="Runs at a time (each gets cores / jobs threads).")
    parser.add_argument(
        "--set", dest="overrides", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
        help="Config overrides applied to every run (train.py --FIELD VALUE).",
    )  # fmt: skip
    parser.add_argument("--eval", dest="eval_task", default=None, help="After training, run sharpgrpo.eval --task.")
    parser.add_argument("--eval_limit", type=int, default=None, help="sharpgrpo.eval --limit (problems per group).")
    parser.add_argument(
        "--eval_set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
        help="Other sharpgrpo.eval options, e.g. n_samples=8 max_new_tokens=8 temperature=1.0.",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="Threads per run (default: cores // jobs, >= 1).")
    parser.add_argument("--timeout", type=float, default=None, help="Seconds after which a run counts as failed.")
    parser.add_argument("--spike_factor", type=float, default=3.0, help="Grad-norm spike: above this x the median.")
    parser.add_argument("--confidence", type=float, default=0.95, help="Interval level (Student t over seeds).")
    parser.add_argument(
        "--smooth", type=float, default=0.0, help="Plots only: EMA weight in (0, 1) applied to each run's curve."
    )
    parser.add_argument(
        "--stop_grace", type=float, default=120.0,
        help="On Ctrl-C / SIGTERM: seconds the running train.py get to save a checkpoint and stop before a kill.",
    )  # fmt: skip
    parser.add_argument("--python", default=sys.executable, help="Python interpreter of the runs.")
    parser.add_argument(
        "--report_only", action="store_true",
        help="Run nothing: aggregate the finished runs and list the others as missing (e.g. while a comparison runs).",
    )  # fmt: skip
    args = parser.parse_args(argv)

    if args.jobs < 1:
        parser.error("--jobs must be >= 1.")
    if not 0 < args.confidence < 1:
        parser.error("--confidence must be in (0, 1).")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds lists a seed twice: {args.seeds}.")
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config} does not exist.")
    try:
        specs = [parse_strategy(entry) for entry in args.strategies]
        overrides = parse_overrides(args.overrides)
        eval_set = parse_overrides(args.eval_set)
    except ValueError as error:
        parser.error(str(error))
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels) or len({s.slug for s in specs}) != len(specs):
        parser.error(f"--strategies lists an entry twice: {labels}.")
    _validate_strategy_names(specs, parser)

    output = Path(args.output)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    config = Path(args.config).resolve()
    runs = plan_runs(str(config), specs, args.seeds, output.resolve(), overrides, args.eval_task, args.eval_limit,
                     eval_set)  # fmt: skip
    command = "python -m sharpgrpo.compare " + " ".join(argv if argv is not None else sys.argv[1:])
    if os.sep in args.python:  # the runs start in the repository root: a relative interpreter path is from here
        args.python = str(Path(args.python).absolute())
    interrupted = False
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
            print(f"  {run.spec.label} seed {run.seed}: {run.error}; log: {_shown(run.log)}", file=sys.stderr)
    return summary


def _stop_signals_as_keyboard_interrupt() -> dict[int, Any]:
    """Make SIGINT, SIGTERM and SIGHUP stop the comparison like Ctrl-C; return the previous handlers (none off the
    main thread, where handlers cannot be set). SIGINT too: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then raises no KeyboardInterrupt for it (train.py's
    own handler, sharpgrpo.lifecycle, is installed the same way)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        raise KeyboardInterrupt

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def _validate_strategy_names(specs: list[StrategySpec], parser: argparse.ArgumentParser) -> None:
    """Unknown strategy names fail before any run starts (the registry lists the valid ones)."""
    from sharpgrpo.strategies import STRATEGIES

    for spec in specs:
        for name in spec.names:
            try:
                STRATEGIES.get(name)
            except ValueError as error:
                parser.error(str(error))


if __name__ == "__main__":
    result = main()
    sys.exit(1 if any(r["status"] == "failed" for r in result["runs"]) else 0)
