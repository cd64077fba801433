"""One-line errors for every command: any error of a command's body is printed as one ``error:`` line after the
progress bars are closed, and the full traceback with ``--debug`` or ``SHARPGRPO_DEBUG=1``.

Several processes (``accelerate launch``, torchrun): a refusal every process raises alike (a config or input error,
an error the processes agreed on) is printed by the main process only; the others exit quietly with the same
status. An error of one process alone is printed by that process, naming it."""

from __future__ import annotations

import contextlib
import os
import sys
import time

DEBUG_FLAG = "--debug"
DEBUG_ENV = "SHARPGRPO_DEBUG"
QUIET_EXIT_DELAY_S = 3.0  # how long a quiet (non-main) process waits before exiting with the main process's error
_debugging = False  # set by one_line_errors: --debug or SHARPGRPO_DEBUG=1 was given


@contextlib.contextmanager
def one_line_errors(argv: list[str] | None = None):
    """Run the script's body; an error prints ``error: <message>`` (one line) and exits with status 1; an interrupt
    that reaches here (a second Ctrl-C) prints one line and exits with status 130.

    ``--debug`` (removed from ``argv``, ``sys.argv`` by default, before the parser sees it) or the environment
    variable ``SHARPGRPO_DEBUG=1`` lets the exception propagate with its full traceback instead.
    """
    global _debugging
    argv = sys.argv if argv is None else argv
    debug = os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")
    while DEBUG_FLAG in argv:
        argv.remove(DEBUG_FLAG)
        debug = True
    _debugging = debug
    try:
        yield
    except SystemExit as stop:  # a message given to SystemExit ("error: ..."): printed after the progress bars
        if isinstance(stop.code, str):
            close_progress_bars()
            if _prints(shared=True):
                print(stop.code if stop.code.startswith("error: ") else f"error: {stop.code}", file=sys.stderr,
                      flush=True)  # fmt: skip
            else:
                time.sleep(QUIET_EXIT_DELAY_S)
            sys.exit(1)
        raise
    except KeyboardInterrupt:  # a second Ctrl-C stops at once (the first one asks for a checkpoint): no traceback
        if debug:
            close_progress_bars()
            raise
        close_progress_bars()
        print("error: interrupted (Ctrl-C) and stopped at once; nothing after the last saved checkpoint was kept "
              f"(full traceback: {DEBUG_FLAG} or {DEBUG_ENV}=1)", file=sys.stderr)  # fmt: skip
        sys.exit(130)
    except Exception as error:
        if debug:
            close_progress_bars()
            raise
        close_progress_bars()
        # Raised alike on every process: a refusal of the config or inputs (names_itself), or a training error the
        # processes agreed on (everywhere); an error that says it happened here only (everywhere=False) is printed.
        everywhere = getattr(error, "everywhere", None)
        shared = bool(getattr(error, "names_itself", False)) if everywhere is None else bool(everywhere)
        if _prints(shared):
            print(error_line(error, process=None if shared else _process_rank()), file=sys.stderr, flush=True)
        else:  # the main process prints it: a launcher stops every process once one exits with an error, so give the
            time.sleep(QUIET_EXIT_DELAY_S)  # main process the moment to print before this one's exit ends the launch
        sys.exit(1)


def _process_rank() -> int | None:
    """This process's rank under a multi-process launch (the launcher's ``RANK``), None when alone."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None or not rank.isdigit() or world in ("", "1"):
        return None
    return int(rank)


def _prints(shared: bool) -> bool:
    """Whether this process prints an error: always when alone or the main process; another process prints only an
    error of its own (``shared``: every process raised it alike, so the main process's line says it)."""
    rank = _process_rank()
    return rank is None or rank == 0 or not shared


# Built-in errors whose message names what is wrong by itself: no ``ValueError:`` in front of the line.
_PLAIN = (ValueError,)


def error_line(error: BaseException, process: int | None = None) -> str:
    """The one line an error prints: ``error: <message> (full traceback: ...)``; ``process``: the rank of the
    process it happened on, when it happened on one process of several."""
    message = " ".join(str(error).split()) or repr(error)
    plain = getattr(error, "names_itself", False) or (type(error) in _PLAIN and str(error).strip())
    prefix = "" if plain else f"{type(error).__name__}: "
    where = f"process {process}: " if process is not None else ""
    return f"error: {where}{prefix}{message} (full traceback: {DEBUG_FLAG} or {DEBUG_ENV}=1)"


def exit_together(error: BaseException, is_main_process: bool, wait_for_everyone) -> None:
    """End every process of a launch on an error they all raised together, with one error line.

    The main process prints the line; then all wait for each other and exit with status 1. Waiting after the print
    matters: a launcher (torch's elastic agent under ``accelerate launch``) stops the other processes as soon as one
    exits with an error, which would otherwise kill the main process before its line or its plot is written. With
    ``--debug`` the error propagates with its traceback instead (nothing is done here)."""
    if _debugging:
        return
    if is_main_process:
        close_progress_bars()
        print(error_line(error), file=sys.stderr, flush=True)
    wait_for_everyone()
    raise SystemExit(1)


def close_progress_bars() -> None:
    """Close every open tqdm bar (the training bar of an interrupted run) so the error is the last thing shown and
    no bar is redrawn after it."""
    tqdm_module = sys.modules.get("tqdm")  # not imported: no bar
    if tqdm_module is None:
        return
    for bar in list(getattr(tqdm_module.tqdm, "_instances", ())):
        with contextlib.suppress(Exception):  # a bar that cannot redraw (closed stream) must not hide the error
            bar.close()
    sys.stdout.flush()
