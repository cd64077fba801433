"""The runs of a comparison (``sharpgrpo compare``): each (strategy, seed) is its own ``sharpgrpo train`` run of one config (``python -m sharpgrpo.cli.train``),
planned into ``OUTPUT/runs/<strategy>/seed<k>/``, reused when its ``compare_run.json`` marker matches the command and
the config file's contents, and executed in child processes (at most ``jobs`` at a time) that a stop request
interrupts the way Ctrl-C interrupts ``sharpgrpo train`` (a checkpoint, then exit; a kill after ``stop_grace`` seconds).

A strategy entry is ``NAME[+NAME...][:field=value[,field=value...]]``: ``grpo_sg+thr`` composes two strategies,
``thr:thr_p=-0.1`` sets a parameter; its label (``thr (thr_p=-0.1)``) names it in the tables and plots.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from sharpgrpo.diagnostics.curves import TRAINER_STATE

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = "compare_run.json"
NOT_FINISHED = "not finished"  # Run.stale_reason() of a run with no marker (never ran, or did not finish)
LOG = "train.log"


def shown_path(path: Path) -> str:
    """A path relative to the working directory when it lies below it (reports carry no machine paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


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
    """One :class:`Run` per (strategy, seed) with its ``sharpgrpo train`` arguments (config, overrides, then the entry's
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
    if (REPO_ROOT / "pyproject.toml").is_file():  # a source checkout: the runs import this very copy of the package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# What each child process runs, as ``python -m MODULE``: the package's own command modules, so that an installed
# wheel (which has no ``train.py`` script) runs them as a source checkout does.
TRAIN_MODULE, EVAL_MODULE = "sharpgrpo.cli.train", "sharpgrpo.cli.eval"
COMMAND_NAMES = {TRAIN_MODULE: "sharpgrpo train", EVAL_MODULE: "sharpgrpo eval"}
_TRACEBACK_HINT = re.compile(r"\s*\(full traceback: [^)]*\)\s*$")


def failure_line(log: Path, start: int = 0) -> str | None:
    """The line that says why a child failed, from its part of ``log`` (from byte ``start``): its last ``error:``
    line (the commands' one-line errors, without the traceback hint), else the last line of a traceback or output."""
    try:
        with open(log, "rb") as handle:
            handle.seek(start)
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return _TRACEBACK_HINT.sub("", errors[-1])
    return lines[-1] if lines else None


class Interrupted(Exception):
    """The comparison was stopped (Ctrl-C / SIGTERM) after its running children were stopped."""


class ChildProcesses:
    """The running ``sharpgrpo train`` / ``eval`` processes, and the stop switch that keeps new ones from starting.

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
            process = subprocess.Popen(die_with_this_process(command), start_new_session=True, **kwargs)
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


# Run in the child before it becomes the command: ask Linux to send it SIGTERM when the comparison dies
# (prctl PR_SET_PDEATHSIG = 1; kept across exec), and end if the comparison is already gone (the race before prctl).
_DIE_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
                    "os.getppid() == int(sys.argv[1]) or sys.exit(143); os.execv(sys.argv[2], sys.argv[2:])")


def die_with_this_process(command: list[str]) -> list[str]:
    """``command`` started so that it receives SIGTERM when this process ends, however it ends (a SIGKILL too): a
    training run then saves a checkpoint and stops, instead of training on in its own session holding its folder's
    lock. The children have their own session (Ctrl-C reaches only the comparison), so nothing else would reach them.
    Linux only (elsewhere ``command`` as given). The death signal follows the thread that started the child: each
    child is started by a worker thread that lives until the child has ended."""
    if not sys.platform.startswith("linux"):
        return command
    return [command[0], "-c", _DIE_WITH_PARENT, str(os.getpid()), shutil.which(command[0]) or command[0], *command[1:]]


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
    commands = [[python, "-m", TRAIN_MODULE, *run.train_args]]
    if run.eval_args is not None:
        commands.append([python, "-m", EVAL_MODULE, "--model", str(run.directory), *run.eval_args,
                         "--output", str(run.eval_output)])  # fmt: skip
    with open(run.log, "w", encoding="utf-8") as log:
        for command in commands:
            log.write("$ " + " ".join(command) + "\n")
            log.flush()
            start = log.tell()
            # In the comparison's own folder: a relative path in --set means what it meant to the checks before.
            process = children.start(command, stdout=log, stderr=subprocess.STDOUT, env=env)
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
                log.flush()
                reason = failure_line(run.log, start)
                run.status = "failed"
                run.error = f"{COMMAND_NAMES[command[2]]} exited with code {code}" + (f": {reason}" if reason else "")
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
                    bar.write(f"FAILED {run.spec.label} seed {run.seed}: {run.error}; log: {shown_path(run.log)}")
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
