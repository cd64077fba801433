"""Config validation happens in SharpGRPOConfig itself, before any model is loaded."""

import pytest

from sharpgrpo import SharpGRPOConfig


def make(tmp_path, **kwargs):
    return SharpGRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, **kwargs)


def test_defaults_follow_methods(tmp_path):
    args = make(tmp_path)
    assert args.strategies == ["grpo_sg"]
    assert (args.sg_alpha, args.sg_mu, args.sg_lower, args.sg_upper) == (2.0, 0.25, 1.0, 1.4)
    assert args.sg_tau == pytest.approx(1 / 9)
    assert (args.weight_placement, args.kl_weighting) == ("loss", "loss")  # METHODS §1 (revised)
    assert args.cw_advantage_mean == "response"  # METHODS §2 (revised)


def test_strategies_accept_string_list_and_comma_form(tmp_path):
    assert make(tmp_path, strategies="equal").strategies == ["equal"]
    assert make(tmp_path, strategies="grpo_sg, ar").strategies == ["grpo_sg", "ar"]
    assert make(tmp_path, strategies=["grpo_sg", "cw_grpo"]).strategies == ["grpo_sg", "cw_grpo"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(strategies="sharp_nonsense"), r"Unknown strategy 'sharp_nonsense'\. Valid names: .*equal.*grpo_sg"),
        (dict(strategies="no_such_module.no_such_strategy"), "Could not import module"),
        (dict(strategies=["grpo_sg", "reverse"]), "At most one token-weight strategy"),
        (dict(strategies=[]), "empty"),
        (dict(sg_lower=1.5, sg_upper=1.4), r"sg_lower.*must not exceed"),
        (dict(sg_tau=0.0), "sg_tau` must be > 0"),
        (dict(sg_tau=-1.0), "sg_tau` must be > 0"),
        (dict(sg_alpha=0.0), "sg_alpha` must be > 0"),
        (dict(weight_placement="inside"), "weight_placement` must be one of ratio, loss"),
        (dict(kl_weighting="outside"), "kl_weighting` must be one of loss, inside, none"),
        (dict(loss_type="cispo"), "loss_type` must be one of dapo, grpo, bnpo, dr_grpo"),
        (dict(importance_sampling_level="chunk"), "importance_sampling_level"),
        (dict(random_weight_low=1.5, random_weight_high=0.5), "random_weight_low"),
        (dict(cw_scope="everything"), "cw_scope"),
        (dict(entropy_coef=0.01), "entropy bonus"),
    ],
)
def test_bad_configs_raise_clear_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kwargs)


def test_user_strategy_by_dotted_path(tmp_path):
    args = make(tmp_path, strategies="sharpgrpo.strategies.probability_shaping.EqualWeights")
    assert args.strategies == ["sharpgrpo.strategies.probability_shaping.EqualWeights"]
