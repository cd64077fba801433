"""Strategy parameters have one home (``sharpgrpo.strategy_params``): every name a strategy declares in ``params`` is
a config field, every parameter is read by some strategy, and the model card lists exactly the declared ones."""

from dataclasses import fields

import pytest
from helpers import cpu_config

from sharpgrpo import SharpGRPOConfig
from sharpgrpo.config import FIELD_RULES
from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.strategy_params import StrategyParams
from sharpgrpo.training.model_card import strategy_card_section


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_declared_params_are_config_fields(name):
    config_fields = {f.name for f in fields(SharpGRPOConfig)}
    params = STRATEGIES.get(name).params
    assert len(set(params)) == len(params)
    assert set(params) <= config_fields, f"{name}: {sorted(set(params) - config_fields)} are not config fields"


def test_every_strategy_parameter_is_read_by_a_strategy_and_ruled():
    declared = {param for name in STRATEGIES for param in STRATEGIES.get(name).params}
    for field in fields(StrategyParams):
        assert field.name in declared, f"{field.name}: no registered strategy lists it in `params`"
        assert field.name in FIELD_RULES
        assert field.metadata["help"]


def test_config_inherits_the_strategy_parameters(tmp_path):
    config, params = cpu_config(tmp_path), StrategyParams()
    for field in fields(StrategyParams):
        assert getattr(config, field.name) == getattr(params, field.name)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_model_card_lists_the_declared_params(tmp_path, name):
    config = cpu_config(tmp_path, thr_p=-0.2, passk_k=2, cw_scope="batch")
    config.strategies = [name]
    line = next(line for line in strategy_card_section(config).splitlines() if line.startswith(f"- **`{name}`**"))
    listed = line.split("(", 1)[1].split(")", 1)[0]
    expected = ", ".join(f"`{f}={getattr(config, f)!r}`" for f in STRATEGIES.get(name).params)
    assert listed == (expected or "no parameters")


def test_a_parameter_no_selected_strategy_reads_warns_naming_its_strategy(tmp_path):
    """`thr_p` with `strategies: grpo_sg` does nothing: the config warns, naming thr; a parameter a selected strategy
    reads, or one left at its default, does not warn."""
    import warnings

    from helpers import cpu_config

    with pytest.warns(UserWarning, match=r"^thr_p=0.3 is not read by strategies=\['grpo_sg'\]: it is a parameter of thr"):
        cpu_config(tmp_path, strategies="grpo_sg", thr_p=0.3)
    with pytest.warns(UserWarning, match=r"^passk_k=8 is not read .* a parameter of passk_mixed"):
        cpu_config(tmp_path, strategies="thr", passk_k=8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*is not read by strategies")
        cpu_config(tmp_path, strategies=["grpo_sg", "thr"], thr_p=0.3, sg_alpha=3.0)
        cpu_config(tmp_path, strategies="equal")
