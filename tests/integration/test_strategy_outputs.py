"""A user strategy whose output is wrong (NaN, wrong shape, weight <= 0) stops training with an error naming it.

The tiny model really trains: the faulty strategies behave for the first step (parameters change), then go wrong,
and the trainer refuses the step with the strategy's configured name and what was wrong.
"""

import pytest
import torch
from helpers import make_trainer, tiny_config

from sharpgrpo.strategies import STRATEGIES, AdvantageStrategy, TokenWeightStrategy, register_strategy

pytestmark = pytest.mark.slow


class _FaultyAfterFirstStep:
    """Good output on the first call, then the fault named by the registered name."""

    calls = 0

    def _fault(self, good: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        if type(self).calls == 1:
            return good
        fault = self.fault
        if fault == "nan":  # the first completion token of every row
            good[:, 0] = float("nan")
            return good
        if fault == "shape":
            return good[:, :1]
        if fault == "zero":
            return good * 0.0
        raise AssertionError(fault)


def _register(name: str, base: type, fault: str) -> None:
    if name in STRATEGIES:
        return
    if base is TokenWeightStrategy:
        def weights(self, logps, mask):
            return self._fault(torch.ones_like(logps), mask)

        def bounds(self):
            return 1.0, 1.0

        methods = {"weights": weights, "bounds": bounds}
    else:
        def token_advantages(self, batch):
            return self._fault(batch.advantages.clone(), batch.completion_mask), {}

        methods = {"token_advantages": token_advantages, "needs_old_logps": False}
    class_name = name.title().replace("_", "")
    register_strategy(name)(type(class_name, (_FaultyAfterFirstStep, base), {"fault": fault, **methods}))


CASES = [
    ("test_weights_nan", TokenWeightStrategy, "nan", "non-finite value"),
    ("test_weights_shape", TokenWeightStrategy, "shape", "of shape (8, 1); expected (8, "),
    ("test_weights_zero", TokenWeightStrategy, "zero", "value(s) <= 0 on completion tokens"),
    ("test_advantages_nan", AdvantageStrategy, "nan", "non-finite value"),
    ("test_advantages_shape", AdvantageStrategy, "shape", "of shape (8, 1); expected (8, "),
]


@pytest.mark.parametrize(("name", "base", "fault", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_wrong_strategy_output_stops_training_naming_the_strategy(tiny_model_path, tmp_path, name, base, fault,
                                                                 fragment):
    _register(name, base, fault)
    STRATEGIES.get(name).calls = 0
    strategies = [name] if base is TokenWeightStrategy else ["equal", name]
    args = tiny_config(tmp_path, strategies=strategies, per_device_train_batch_size=8, num_generations=4,
                       max_completion_length=6, max_steps=3)
    trainer = make_trainer(tiny_model_path, args, train_dataset=32)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(ValueError) as info:
        trainer.train()
    message = str(info.value)
    assert message.startswith(f"Strategy {name!r} (") and STRATEGIES.get(name).__qualname__ in message, message
    assert fragment in message, message
    assert trainer.state.global_step == 1  # the first step trained with good output; the second was refused
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
