"""The README's recipe for a new strategy, followed from a test file: a class with its pure function, its parameters
listed in ``params`` (read from the one parameter home), its own config check and paper, registered by name. It then
gets, with no other edit, what the shipped strategies get: the config's checks (its own and every weight strategy's),
the model card, and training."""

import warnings

import pytest
import torch
from helpers import cpu_config, make_trainer, tiny_config

from sharpgrpo.strategies import STRATEGIES, StrategyPaper, TokenWeightStrategy, register_strategy
from sharpgrpo.training.model_card import strategy_card_section
from sharpgrpo.validation import ConfigError

NAME = "test_low_probability_boost"


def low_probability_boost(p: torch.Tensor, alpha: float) -> torch.Tensor:
    """w = 1 + alpha (1 - p): rarer sampled tokens weigh more. Shapes: p (B, T) -> w (B, T)."""
    return 1.0 + alpha * (1.0 - p)


class LowProbabilityBoost(TokenWeightStrategy):
    """A user's weight strategy: ``low_probability_boost`` of the detached probabilities, alpha = ``sg_alpha``."""

    params = ("sg_alpha", *TokenWeightStrategy.params)
    paper = StrategyPaper("A test strategy", "Nobody 2026, the README's recipe as a test.")

    @classmethod
    def check_config(cls, args) -> None:
        if args.sg_alpha > 3:
            raise ConfigError(f"sg_alpha={args.sg_alpha}: {NAME} needs sg_alpha <= 3 (weights up to 4).")
        super().check_config(args)

    def bounds(self) -> tuple[float, float]:
        return 1.0, 1.0 + self.args.sg_alpha

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return low_probability_boost(logps.exp(), self.args.sg_alpha)


if NAME not in STRATEGIES:
    register_strategy(NAME)(LowProbabilityBoost)


def test_its_config_check_runs_when_it_is_selected(tmp_path):
    with pytest.raises(ConfigError, match=rf"^sg_alpha=4\.0: {NAME} needs sg_alpha <= 3"):
        cpu_config(tmp_path, strategies=[NAME], sg_alpha=4.0)
    cpu_config(tmp_path, strategies=["equal"], sg_alpha=4.0)  # not selected: its check does not apply


def test_the_weight_strategy_checks_apply_to_it(tmp_path):
    with pytest.raises(ConfigError, match="weight_placement=ratio: not defined for loss_type=vespo"):
        cpu_config(tmp_path, strategies=[NAME], weight_placement="ratio", loss_type="vespo")
    with pytest.raises(ValueError, match="At most one token-weight strategy"):
        cpu_config(tmp_path, strategies=[NAME, "grpo_sg"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu_config(tmp_path, strategies=[NAME], weight_placement="ratio")
    assert any("every token whose weight exceeds 1 + epsilon_high" in str(w.message) for w in caught)


def test_the_model_card_lists_it_with_its_params_and_paper(tmp_path):
    config = cpu_config(tmp_path, strategies=[NAME], sg_alpha=0.5)
    line = next(line for line in strategy_card_section(config).splitlines() if line.startswith(f"- **`{NAME}`**"))
    assert "`sg_alpha=0.5`" in line and "`weight_placement='loss'`" in line
    assert "Nobody 2026, the README's recipe as a test." in line


@pytest.mark.slow
def test_it_trains(tiny_model_path, tmp_path):
    trainer = make_trainer(tiny_model_path, tiny_config(tmp_path / "good", strategies=[NAME], max_steps=2))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    logged = [entry for entry in trainer.state.log_history if "token_weight/mean" in entry]
    assert logged and all(1.0 <= entry["token_weight/mean"] <= 1.0 + trainer.args.sg_alpha for entry in logged)

