"""The marks of the vLLM tests (``tests/with_vllm``; the folder is not named ``vllm``, which would shadow the package
as a namespace package where vLLM is not installed)."""

import importlib.util

import pytest

VLLM_MISSING = importlib.util.find_spec("vllm") is None
NEEDS_VLLM = [
    pytest.mark.vllm,
    pytest.mark.skipif(VLLM_MISSING, reason='vLLM is not installed: pip install -e ".[vllm]" (docs/vllm-and-async.md, '
                                             '"Generating with vLLM")'),
]
