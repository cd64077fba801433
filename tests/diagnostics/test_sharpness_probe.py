"""The sharpness probe: exact on a quadratic, equal to a finite-difference reference on the tiny model, and
leaving parameters, gradients, mode and random state exactly as they were."""

from __future__ import annotations

import copy

import pytest
import torch

from sharpgrpo.training.loss.sharpness import SHARPNESS_KEYS, sharpness_probe


class Quadratic(torch.nn.Module):
    """L(theta) = 0.5 theta^T A theta + b^T theta, so L(theta + eps) - L(theta) = g^T eps + 0.5 eps^T A eps."""

    def __init__(self, dim: int = 5):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        root = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        self.register_buffer("A", root @ root.T + torch.eye(dim, dtype=torch.float64))
        self.register_buffer("b", torch.randn(dim, generator=generator, dtype=torch.float64))
        self.theta = torch.nn.Parameter(torch.randn(dim, generator=generator, dtype=torch.float64))

    def forward(self):
        return 0.5 * self.theta @ self.A @ self.theta + self.b @ self.theta


def test_quadratic_increase_is_exact():
    model = Quadratic()
    rho = 0.3
    result = sharpness_probe(model, model, rho)
    g = model.A @ model.theta.detach() + model.b
    u = g / g.norm()
    assert set(result) == set(SHARPNESS_KEYS)
    assert result["sharpness/grad_norm"] == pytest.approx(g.norm().item(), rel=1e-12)
    expected = rho * g.norm() + 0.5 * rho**2 * (u @ model.A @ u)
    assert result["sharpness/ascent_loss_increase"] == pytest.approx(expected.item(), rel=1e-10)
    assert result["sharpness/rho"] == rho and result["sharpness/loss"] == pytest.approx(model().item())


@pytest.fixture(scope="module")
def lm_and_batch(tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharpgrpo.data.demo import warm_start_texts

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    batch = tokenizer(warm_start_texts(seed=1, count=4), return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return model, lambda m: m(**batch, labels=labels).loss


def reference_increase(model, loss_of, rho):
    """Finite difference on a copy: backward, normalise, step the copy, evaluate again."""
    twin = copy.deepcopy(model)
    twin.zero_grad(set_to_none=True)
    loss = loss_of(twin)
    loss.backward()
    params = [p for p in twin.parameters() if p.requires_grad]
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=rho / norm)
        return norm, loss_of(twin).item() - loss.item()


@pytest.mark.parametrize("rho", [0.05, 0.5])
def test_tiny_model_matches_finite_difference_and_is_restored(lm_and_batch, rho):
    model, loss_of = lm_and_batch
    model.train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    for index, p in enumerate(trainable):  # pre-existing gradients (an accumulation in progress) must survive
        p.grad = None if index % 3 == 0 else torch.full_like(p, 0.5 + index)
    grads_before = [None if p.grad is None else p.grad.clone() for p in trainable]
    rng_before = torch.get_rng_state()

    result = sharpness_probe(model, lambda: loss_of(model), rho)

    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name  # bit-exact
    for p, grad in zip(trainable, grads_before):
        assert (p.grad is None) if grad is None else torch.equal(p.grad, grad)
    assert model.training and torch.equal(torch.get_rng_state(), rng_before)

    norm, increase = reference_increase(model, loss_of, rho)
    assert result["sharpness/grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert result["sharpness/ascent_loss_increase"] == pytest.approx(increase, rel=1e-3, abs=1e-6)
    assert result["sharpness/ascent_loss_increase"] > 0  # an ascent step along the gradient


def test_small_radius_increase_is_first_order(lm_and_batch):
    model, loss_of = lm_and_batch
    result = sharpness_probe(model, lambda: loss_of(model), rho=1e-3)
    first_order = 1e-3 * result["sharpness/grad_norm"]
    assert result["sharpness/ascent_loss_increase"] == pytest.approx(first_order, rel=0.05)


def test_both_losses_see_the_same_dropout_masks():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)).double()
    model.train()
    x = torch.randn(32, 6, dtype=torch.float64)

    def loss():
        return (model(x) ** 2).mean()

    torch.manual_seed(123)
    result = sharpness_probe(model, loss, rho=0.01)
    # Reference: the same seed before each of the two evaluations.
    twin = copy.deepcopy(model)
    torch.manual_seed(123)
    base = (twin(x) ** 2).mean()
    grads = torch.autograd.grad(base, list(twin.parameters()))
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(twin.parameters(), grads):
            p.add_(g, alpha=0.01 / norm.item())
        torch.manual_seed(123)
        expected = (twin(x) ** 2).mean() - base
    assert result["sharpness/ascent_loss_increase"] == pytest.approx(expected.item(), rel=1e-9)
    torch.manual_seed(123)
    assert result["sharpness/loss"] == pytest.approx(loss().item(), rel=1e-12)


def test_zero_gradient_and_invalid_radius():
    model = Quadratic()
    with torch.no_grad():
        model.theta.copy_(-torch.linalg.solve(model.A, model.b))  # the minimum: g = 0
    result = sharpness_probe(model, model, rho=0.1)
    assert result["sharpness/grad_norm"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="rho"):
        sharpness_probe(model, model, rho=0.0)
