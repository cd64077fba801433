"""Every registered strategy's own metrics get a panel in ``training_curves.png`` and in ``sharpgrpo plot``'s
figures: each strategy trains one real step of the tiny model, and every metric its run logged beyond what a plain
GRPO run (``equal``) logs must be drawn."""

from __future__ import annotations

import math

import pytest

from sharpgrpo.diagnostics.curve_plots import plot_runs, training_curve_keys
from sharpgrpo.diagnostics.curves import load_log_history
from sharpgrpo.strategies import STRATEGIES

# One tiny training step per registered strategy: 25 runs, about 2 to 4 minutes on 2 busy cores, too long for the
# default run; `python -m pytest -q -m every_strategy`, as CI does (.ci/run).
pytestmark = pytest.mark.every_strategy


def train_one_step(model_path, output_dir, strategy: str):
    from helpers import binary_letters_reward, make_trainer, tiny_config

    loss_types = getattr(STRATEGIES.get(strategy), "loss_types", None)
    loss_type = "dapo" if not loss_types or "dapo" in loss_types else loss_types[0]  # gmpo: grpo only
    # binary rewards: correct and incorrect completions in a group, so that THR, Pass@K, KTAE ... act and log
    from sharpgrpo.validation import ConfigError

    options = dict(strategies=[strategy], per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                   max_steps=1, loss_type=loss_type)  # fmt: skip
    try:
        try:
            args = tiny_config(output_dir, **options)
        except ConfigError as error:  # on-policy distillation: the tiny model itself stands in as the teacher;
            if "needs teacher_model" in str(error):  # archer on-policy needs a KL term to act (Strategy.inert)
                args = tiny_config(output_dir, teacher_model=str(model_path), **options)
            elif "would do nothing here" in str(error) and "beta=0" in str(error):
                args = tiny_config(output_dir, beta=0.04, **options)
            else:
                raise
        trainer = make_trainer(model_path, args, reward_funcs=[binary_letters_reward], train_dataset=8)
    except ConfigError as error:  # a strategy of the vLLM engine's log-probabilities: tests/vllm runs it
        if "use_vllm" not in str(error):
            raise
        pytest.skip(f"{strategy} needs vLLM generation: {error}")
    trainer.train()
    trainer.save_state()
    return load_log_history(output_dir)


def logged(history) -> set[str]:
    return {k for entry in history for k, v in entry.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}  # fmt: skip


@pytest.fixture(scope="module")
def plain_keys(tiny_model_path, tmp_path_factory) -> set[str]:
    return logged(train_one_step(tiny_model_path, tmp_path_factory.mktemp("plain"), "equal"))


@pytest.mark.parametrize("strategy", STRATEGIES.names())
def test_every_metric_of_the_strategy_gets_a_panel(tiny_model_path, tmp_path, plain_keys, strategy):
    history = train_one_step(tiny_model_path, tmp_path / "run", strategy)
    own = {k for k in logged(history) - plain_keys if not k.endswith("/std") and k != "train_loss"}
    own -= {k for k in own if k.startswith("train_") or k.startswith("rewards/")}
    own -= {"kl"}  # TRL's own KL metric, logged where a strategy needs beta > 0 to act (archer)
    if STRATEGIES.get(strategy).kind != "weight" and strategy != "equal":
        assert own, f"{strategy} logged no metric of its own"
    assert own <= set(training_curve_keys(history)), own - set(training_curve_keys(history))
    result = plot_runs([tmp_path / "run"], tmp_path / "plots")
    drawn = {key for keys in result["panels"].values() for key in keys}
    assert own <= drawn, own - drawn
    assert all((tmp_path / "plots" / name).stat().st_size > 0 for name in result["panels"])
