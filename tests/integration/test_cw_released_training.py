"""Really train the tiny model with `cw_grpo` as the authors' released code runs it (`cw_variant: released`)."""

import pytest
import torch
from helpers import make_trainer, tiny_config

from sharpgrpo.strategies.covariance import ReleasedCovarianceWeights

pytestmark = pytest.mark.slow


def train(model_path, output_dir, **kwargs):
    args = tiny_config(
        output_dir, strategies="cw_grpo", cw_variant="released", loss_type="grpo", beta=0.04, kl_weighting="none",
        use_bias_correction_kl=False, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        steps_per_generation=1, max_steps=2, **kwargs,
    )
    trainer = make_trainer(model_path, args, train_dataset=64)
    assert isinstance(trainer.weight_strategy, ReleasedCovarianceWeights) and not trainer.advantage_strategies
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter changed"
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def test_released_variant_trains_and_the_gradient_switch_acts(tiny_model_path, tmp_path):
    with_gradient = train(tiny_model_path, tmp_path / "grad")
    without = train(tiny_model_path, tmp_path / "nograd", cw_weight_gradient=False)
    assert len(with_gradient) == len(without) == 2
    for logs in (with_gradient, without):
        for entry in logs:
            # B x T / valid tokens over the micro-batch: >= 1, above 1 whenever a completion is padded.
            assert entry["token_weight/mean"] >= 1.0 - 1e-6 and entry["token_weight/min"] >= 0.0
            assert torch.isfinite(torch.tensor([entry["loss"], entry["grad_norm"]])).all()
    # Same seed, same first completions and weights: only the gradient through w differs.
    assert with_gradient[0]["reward"] == without[0]["reward"]
    assert with_gradient[0]["token_weight/mean"] == pytest.approx(without[0]["token_weight/mean"], rel=1e-6)
    assert with_gradient[0]["grad_norm"] != pytest.approx(without[0]["grad_norm"], rel=1e-4)
