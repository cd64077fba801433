"""One command line for everything: ``sharpgrpo train|eval|compare|plot|tokens|record|serve|vllm-serve [ARGS...]``.

Each subcommand runs its module exactly as ``python -m MODULE ARGS...`` would (``runpy``, as ``__main__``), so
arguments, exit codes and one-line errors are the module's own; ``sharpgrpo SUBCOMMAND --help`` shows its options.
``train``, ``eval``, ``compare``, ``plot``, ``tokens`` and ``record`` are the modules beside this one
(``sharpgrpo.cli.train`` ...; the repository's ``train.py`` is a thin script over ``sharpgrpo.cli.train``); ``serve`` is
``sharpgrpo.search.server`` (the search setting keeps its command line: nothing outside ``sharpgrpo.search``
imports it); ``vllm-serve`` is ``sharpgrpo.cli.vllm_serve`` (TRL's ``trl vllm-serve``, also on vLLM's CPU
build). ``python -m sharpgrpo SUBCOMMAND`` is the same as ``sharpgrpo SUBCOMMAND``.
"""

from __future__ import annotations

import runpy
import sys

# subcommand -> (module run as __main__, what it does)
COMMANDS = {
    "train": ("sharpgrpo.cli.train", "train with a YAML config (a file, or a shipped config by name: demo, ...)"),
    "eval": ("sharpgrpo.cli.eval", "evaluate a model or a run on a task (K&K, math, QA, search QA, ...)"),
    "compare": ("sharpgrpo.cli.compare", "train every (strategy, seed) of one config and compare them"),
    "plot": ("sharpgrpo.cli.plot", "plot runs' training curves and grad-norm variability"),
    "tokens": ("sharpgrpo.cli.tokens", "per-token weights and advantages of a run's completions"),
    "record": ("sharpgrpo.cli.record", "a run's record (config, versions, commit, machine), or two runs' differences"),
    "serve": ("sharpgrpo.search.server", "serve a Search-R1 corpus for retrieval (BM25 or dense)"),
    "vllm-serve": ("sharpgrpo.cli.vllm_serve", "serve a model with vLLM for vllm_mode: server (trl vllm-serve's "
                                               "options)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "usage: sharpgrpo {" + ",".join(COMMANDS) + "} [ARGS...]\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        raise SystemExit(f"error: unknown command {command!r}; must be one of {', '.join(COMMANDS)}.\n{usage()}")
    sys.argv = [f"sharpgrpo {command}", *rest]
    runpy.run_module(COMMANDS[command][0], run_name="__main__", alter_sys=True)
