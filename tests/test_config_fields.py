"""Config validation happens in SharpGRPOConfig itself, before any model is loaded."""

import pytest
from helpers import cpu_config


def test_defaults_follow_methods(tmp_path):
    args = cpu_config(tmp_path)
    assert args.strategies == ["grpo_sg"]
    assert (args.sg_alpha, args.sg_mu, args.sg_lower, args.sg_upper) == (2.0, 0.25, 1.0, 1.4)
    assert args.sg_tau == pytest.approx(1 / 9)
    assert (args.weight_placement, args.kl_weighting) == ("loss", "loss")  # docs/methods.md §1
    assert args.cw_advantage_mean == "response"  # docs/methods.md §2


def test_strategies_accept_string_list_and_comma_form(tmp_path):
    assert cpu_config(tmp_path, strategies="equal").strategies == ["equal"]
    assert cpu_config(tmp_path, strategies="grpo_sg, ar").strategies == ["grpo_sg", "ar"]
    assert cpu_config(tmp_path, strategies=["grpo_sg", "cw_grpo"]).strategies == ["grpo_sg", "cw_grpo"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(strategies="sharp_nonsense"), r"Unknown strategy 'sharp_nonsense'\. Valid names: .*equal.*grpo_sg"),
        (dict(strategies="no_such_module.no_such_strategy"), "Could not import module"),
        (dict(strategies=["grpo_sg", "reverse"]), "At most one token-weight strategy"),
        (dict(strategies=[]), "empty"),
        (dict(sg_lower=1.5, sg_upper=1.4), r"sg_lower.*must not exceed"),
        (dict(sg_tau=0.0), "sg_tau=0: must be a finite number > 0"),
        (dict(sg_tau=-1.0), "sg_tau=-1: must be a finite number > 0"),
        (dict(sg_alpha=0.0), "sg_alpha=0: must be a finite number > 0"),
        (dict(weight_placement="inside"), "weight_placement='inside': must be one of ratio, loss"),
        (dict(kl_weighting="outside"), "kl_weighting='outside': must be one of loss, inside, none"),
        (dict(loss_type="ppo"), "loss_type='ppo': must be one of dapo, grpo, bnpo, dr_grpo, luspo, cispo, sapo, vespo"),
        (dict(importance_sampling_level="chunk"), "importance_sampling_level"),
        (dict(random_weight_low=1.5, random_weight_high=0.5), "random_weight_low"),
        (dict(cw_scope="everything"), "cw_scope"),
    ],
)
def test_bad_configs_raise_clear_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cpu_config(tmp_path, **kwargs)


def test_user_strategy_by_dotted_path(tmp_path):
    args = cpu_config(tmp_path, strategies="sharpgrpo.strategies.probability_shaping.EqualWeights")
    assert args.strategies == ["sharpgrpo.strategies.probability_shaping.EqualWeights"]


def test_every_trl_loss_type_and_the_entropy_bonus_are_accepted(tmp_path):
    """Nothing TRL's GRPOConfig accepts is refused: the loss types its help lists (the pinned version's; a new one
    fails here) and the entropy bonus, static and adaptive."""
    import re

    from trl import GRPOConfig

    from sharpgrpo.strategies.loss_types import LOSS_TYPES

    trl_help = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    trl_loss_types = set(re.findall(r"'(\w+)'", re.search(r"Supported values are (.*?)\.", trl_help).group(1)))
    assert trl_loss_types == set(LOSS_TYPES)
    for loss_type in sorted(trl_loss_types):
        assert cpu_config(tmp_path, loss_type=loss_type, weight_placement="loss", entropy_coef=0.01).loss_type == loss_type
    adaptive = cpu_config(tmp_path, use_adaptive_entropy=True, entropy_target=0.5, weight_placement="loss")
    assert adaptive.use_adaptive_entropy and adaptive.entropy_target == 0.5


@pytest.mark.parametrize("strategies", ["grpo_sg", "equal", "random", "reverse"])
def test_ratio_placement_refused_for_vespo_naming_both_fields(tmp_path, strategies):
    """VESPO's gamma weight acts on a whole sequence's ratio: a token weight has no ratio to scale (README)."""
    with pytest.raises(ValueError, match=r"weight_placement=ratio: not defined for loss_type=vespo"):
        cpu_config(tmp_path, strategies=strategies, loss_type="vespo", weight_placement="ratio")
    assert cpu_config(tmp_path, strategies=strategies, loss_type="vespo", weight_placement="loss").loss_type == "vespo"
    for loss_type in ("cispo", "sapo", "luspo"):  # these have a per-token (or GSPO sequence) ratio to weight
        assert cpu_config(tmp_path, strategies=strategies, loss_type=loss_type, weight_placement="ratio")


def test_ratio_placement_irrelevant_without_a_weight_strategy(tmp_path):
    args = cpu_config(tmp_path, strategies="cw_grpo", loss_type="vespo", weight_placement="ratio")
    assert args.strategies == ["cw_grpo"]
