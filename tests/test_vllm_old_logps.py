"""The documented source of the old (sampling) log-probabilities per generation path (docs/methods.md §13.4, §17.3):
``sampling_truncation`` and ``old_logps_source``. What the strategies actually receive from a real vLLM engine is
checked in tests/with_vllm/test_old_logps.py (marker ``vllm``)."""

from __future__ import annotations

import pytest

from sharpgrpo.training.generation.policy_inputs import old_logps_source, sampling_truncation, vllm_logps_problem


@pytest.mark.parametrize(
    ("fields", "expected"),
    [((1.0, 0, None, None), None), ((0.9, 0, None, None), "top_p=0.9"),
     ((1.0, 20, 0.05, None), "top_k=20, min_p=0.05"), ((1.0, -1, 0.0, None), None),
     ((1.0, 0, None, {"top_p": 0.8}), "top_p=0.8")],
)
def test_sampling_truncation(fields, expected):
    assert sampling_truncation(*fields) == expected


def test_source_named_per_generation_path():
    assert "TRL's old_per_token_logps" in old_logps_source(True, "colocate", True, "top_k=3", False)
    assert "vLLM's own" in old_logps_source(True, "colocate", False, None, False)
    assert "recomputed" in old_logps_source(True, "colocate", False, "top_k=3", False)
    assert "top_k=3-truncated" in old_logps_source(True, "colocate", False, "top_k=3", False)
    assert "--logprobs-mode" in old_logps_source(True, "server", False, None, False)
    assert "decoding steps" in old_logps_source(False, None, False, "top_p=0.9", True)
    assert vllm_logps_problem("colocate", None) is None
