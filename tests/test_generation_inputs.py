"""Registered generation inputs (``sharpgrpo.training.generation.inputs``): a strategy names an extra per-token input
in ``needs_inputs``; the config refuses one no provider supplies, and a provider's output is checked per batch."""

import pytest
import torch
from helpers import cpu_config

from sharpgrpo.strategies import STRATEGIES, AdvantageStrategy, register_strategy
from sharpgrpo.training.generation.inputs import GENERATION_INPUTS, provided_inputs, register_generation_input
from sharpgrpo.training.strategy_set import StrategySet
from sharpgrpo.validation import ConfigError


class NeedsUnknownInput(AdvantageStrategy):
    needs_old_logps = False
    needs_inputs = ("test_no_such_input",)


class NeedsTestInput(AdvantageStrategy):
    needs_old_logps = False
    needs_inputs = ("test_row_index",)


for name, cls in (("test_needs_unknown_input", NeedsUnknownInput), ("test_needs_row_index", NeedsTestInput)):
    if name not in STRATEGIES:
        register_strategy(name)(cls)
if "test_row_index" not in GENERATION_INPUTS:
    @register_generation_input("test_row_index")
    def row_index(trainer):
        return lambda output: torch.arange(output["completion_ids"].shape[0], dtype=torch.float32)[:, None].expand(
            output["completion_ids"].shape)


def test_an_input_no_provider_supplies_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"test_needs_unknown_input needs the generation input 'test_no_such_input'"):
        cpu_config(tmp_path, strategies=["test_needs_unknown_input"])


def test_the_strategy_set_names_what_is_needed(tmp_path):
    strategies = StrategySet(cpu_config(tmp_path, strategies=["test_needs_row_index"]))
    assert strategies.needs(trl_computes_old_logps=False).inputs == ("test_row_index",)
    assert not strategies.needs(trl_computes_old_logps=False).old_logps


def test_a_provider_output_is_checked_and_detached():
    output = {"completion_ids": torch.zeros(3, 4, dtype=torch.long)}
    provide = GENERATION_INPUTS.get("test_row_index")(None)
    values = provided_inputs({"test_row_index": provide}, output)["test_row_index"]
    assert values.shape == (3, 4) and torch.equal(values[:, 0], torch.tensor([0.0, 1.0, 2.0]))
    weight = torch.ones(3, 4, requires_grad=True)
    assert not provided_inputs({"x": lambda output: weight * 2}, output)["x"].requires_grad
    expected = r"Generation input 'bad' returned \(3, 1\); expected a tensor of shape \(3, 4\)"
    with pytest.raises(ValueError, match=expected):
        provided_inputs({"bad": lambda output: torch.zeros(3, 1)}, output)
