"""The loss-side strategies at config time: every parameter out of range, every undefined composition and every
unsupported loss type or importance-sampling level is refused in one line naming the field or both strategies; the
settings where a strategy does nothing (on-policy) or departs from TRL's GMPO warn."""

import math
import warnings

import pytest
from helpers import cpu_config

from sharpgrpo.strategies import STRATEGIES, TokenLossStrategy
from sharpgrpo.validation import ConfigError

NEW = ["clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "gmpo"]
OFF_POLICY = dict(num_iterations=2)

BAD_PARAMS = [
    (dict(clip_cov_ratio=0.0), "clip_cov_ratio=0: must be"),
    (dict(clip_cov_ratio=1.5), "clip_cov_ratio=1.5: must be"),
    (dict(clip_cov_lb=math.nan), "clip_cov_lb=nan: must be"),
    (dict(clip_cov_ub=math.inf), "clip_cov_ub=inf: must be"),
    (dict(clip_cov_lb=5.0, clip_cov_ub=5.0), "clip_cov_lb=5.0: must be below clip_cov_ub=5.0"),
    (dict(clip_cov_keep_value="yes"), "clip_cov_keep_value='yes': must be one of False, True"),
    (dict(kl_cov_ratio=0.0), "kl_cov_ratio=0: must be"),
    (dict(kl_cov_coef=-0.1), "kl_cov_coef=-0.1: must be"),
    (dict(kl_cov_keep_clip=2), "kl_cov_keep_clip=2"),
    (dict(dppo_tv_low=0.0), "dppo_tv_low=0: must be"),
    (dict(dppo_tv_high=-1.0), "dppo_tv_high=-1: must be"),
    (dict(dppo_kl_low=math.inf), "dppo_kl_low=inf: must be"),
    (dict(dppo_kl_high=0.0), "dppo_kl_high=0: must be"),
    (dict(dppo_keep_clip=None), "dppo_keep_clip=None"),
    (dict(gmpo_epsilon_low=0.0), "gmpo_epsilon_low=0: must be"),
    (dict(gmpo_epsilon_high=math.nan), "gmpo_epsilon_high=nan: must be"),
]


@pytest.mark.parametrize(("fields", "fragment"), BAD_PARAMS, ids=[fragment.split(":")[0] for _, fragment in BAD_PARAMS])
def test_out_of_range_parameter_is_refused_in_one_line(tmp_path, fields, fragment):
    with pytest.raises(ConfigError) as error:
        cpu_config(tmp_path, strategies="equal", **fields)
    message = str(error.value)
    assert fragment in message and "\n" not in message


BAD_COMPOSITIONS = [
    (dict(strategies=["kl_cov", "dppo_tv"]), ("kl_cov", "dppo_tv", "clip range")),
    (dict(strategies=["dppo_tv", "dppo_kl"]), ("dppo_tv", "dppo_kl", "clip range")),
    (dict(strategies=["gmpo", "equal"], loss_type="grpo"), ("gmpo", "equal", "sequence-level")),
    (dict(strategies=["cw_grpo", "gmpo"], loss_type="grpo"), ("gmpo", "cw_grpo", "sequence-level")),
    (dict(strategies=["gmpo", "clip_cov"], loss_type="grpo"), ("gmpo", "clip_cov", "sequence-level")),
    (dict(strategies="gmpo"), ("gmpo", "loss_type=dapo")),
    (dict(strategies="clip_cov", loss_type="cispo"), ("clip_cov", "loss_type=cispo")),
    (dict(strategies="dppo_kl", loss_type="sapo"), ("dppo_kl", "loss_type=sapo")),
    (dict(strategies="kl_cov", loss_type="vespo"), ("kl_cov", "loss_type=vespo")),
    (dict(strategies="dppo_tv", importance_sampling_level="sequence"), ("dppo_tv", "importance_sampling_level")),
    (dict(strategies="gmpo", loss_type="grpo", importance_sampling_level="sequence_token"),
     ("gmpo", "importance_sampling_level")),
]


@pytest.mark.parametrize(("fields", "fragments"), BAD_COMPOSITIONS, ids=lambda v: str(v)[:40])
def test_undefined_composition_is_refused_naming_both(tmp_path, fields, fragments):
    with pytest.raises(ConfigError) as error:
        cpu_config(tmp_path, **OFF_POLICY, **fields)
    message = str(error.value)
    assert all(fragment in message for fragment in fragments) and "\n" not in message, message


DEFINED = [
    dict(strategies=["grpo_sg", "dppo_tv"]),
    dict(strategies=["grpo_sg", "dppo_kl"], weight_placement="ratio"),
    dict(strategies=["cw_grpo", "clip_cov", "kl_cov"]),
    dict(strategies=["thr", "clip_cov"]),
    dict(strategies="dppo_tv", loss_type="cispo", epsilon_high=20.0),
    dict(strategies="gmpo", loss_type="grpo"),
    *[dict(strategies=name, loss_type=loss_type) for name in ("clip_cov", "kl_cov", "dppo_tv")
      for loss_type in ("dapo", "grpo", "bnpo", "dr_grpo", "luspo")],
]


@pytest.mark.parametrize("fields", DEFINED, ids=lambda v: str(v)[:60])
def test_defined_composition_is_accepted_without_warning(tmp_path, fields):
    """Accepted, and no strategy warns (``weight_placement: ratio`` keeps its own warning about the clip)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = cpu_config(tmp_path, **OFF_POLICY, **fields)
    assert not [w for w in caught if str(w.message).startswith("strategies:")]
    assert any(STRATEGIES.get(name).kind == "loss" for name in args.strategies)


@pytest.mark.parametrize("name", ["kl_cov", "dppo_tv", "dppo_kl"])
def test_on_policy_training_warns_that_the_strategy_does_nothing(tmp_path, name):
    with pytest.warns(UserWarning, match=f"strategies: {name} with num_iterations=1"):
        cpu_config(tmp_path, strategies=name)


def test_gmpo_with_bias_corrected_kl_warns(tmp_path):
    with pytest.warns(UserWarning, match="use_bias_correction_kl"):
        cpu_config(tmp_path, strategies="gmpo", loss_type="grpo", beta=0.04, use_bias_correction_kl=True)


def test_new_strategies_are_loss_kind_with_declared_parameters():
    """Registered under the names users know, kind 'loss', and every parameter they read is a declared field."""
    from dataclasses import fields

    from sharpgrpo.strategy_params import StrategyParams

    declared = {f.name for f in fields(StrategyParams)}
    for name in NEW:
        cls = STRATEGIES.get(name)
        assert issubclass(cls, TokenLossStrategy) and cls.kind == "loss" and cls.registered_name() == name
        assert cls.paper is not None and set(cls.params) <= declared
