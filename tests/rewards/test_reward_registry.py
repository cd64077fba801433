"""The reward registry: names used by configs, dotted paths, and no torch import."""

import subprocess
import sys
from pathlib import Path

import pytest

import reward_fns
from reward_fns import REWARD_FUNCTIONS, get_reward_function, kk_reward, math_reward, qa_em_reward, think_format_reward


def test_registered_names():
    assert {"kk", "math", "qa_em", "think_format"} <= set(REWARD_FUNCTIONS.names())
    assert get_reward_function("kk") is kk_reward
    assert get_reward_function("math") is math_reward
    assert get_reward_function("qa_em") is qa_em_reward
    assert get_reward_function("think_format") is think_format_reward


def test_dotted_paths_and_unknown_names():
    assert get_reward_function("reward_fns.qa.qa_em_reward") is qa_em_reward
    assert get_reward_function("reward_fns.kk:kk_correct") is reward_fns.kk_correct
    with pytest.raises(ValueError, match="Valid names: .*kk.*math.*qa_em.*think_format"):
        get_reward_function("no_such_reward")


def test_duplicate_registration_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        reward_fns.register_reward("kk")(lambda prompts, completions, **kwargs: [0.0] * len(completions))


# Any attempt to import torch fails fast in the child, so a violation is reported without paying for torch's import.
NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("reward_fns imported torch")

sys.meta_path.insert(0, NoTorch())
import reward_fns
from reward_fns import kk_reward, math_reward, qa_em_reward, think_format_reward
"""


def test_reward_functions_import_without_torch():
    repo_root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=120, cwd=repo_root
    )
    assert result.returncode == 0, result.stderr[-3000:]
