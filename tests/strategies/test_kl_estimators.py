"""KL estimators (docs/methods.md §15.3) against verl's released ``kl_penalty`` and TRL's KL line, float64, values and
gradients.

The verl reference reproduces ``kl_penalty`` and ``kl_penalty_forward`` of verl-project/verl@1dda039
``verl/trainer/ppo/core_algos.py`` L2187-2253 line by line; it always runs. Where verl's released package is
installed (verl 0.9.1 on PyPI, docs/development.md: "Tests against verl's released code"), the released ``kl_penalty``
(verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` L2188-2213, with ``kl_penalty_forward`` L2216-2251) is also called
unchanged on the same inputs; that test skips with the reason where it is not. TRL's line is
``trl/trainer/grpo_trainer.py`` L3100-3102 (trl 1.16.0), also reproduced, so the test does not depend on where TRL
keeps it.
"""

from __future__ import annotations

import pytest
import torch

from sharpgrpo.strategies.kl_estimators import KL_ESTIMATORS, kl_estimate

SEEDS = [0, 1, 2]


def verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):  # core_algos.py L2215-2253
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def verl_kl_penalty(logprob, ref_logprob, kl_penalty):  # core_algos.py L2187-2212
    base_kl_penalty = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = verl_kl_penalty_forward(logprob, ref_logprob, base_kl_penalty)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def trl_kl(ref_per_token_logps, per_token_logps):  # trl 1.16.0 grpo_trainer.py L3100-3102
    return torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1


VERL_NAME = {"k1": "k1", "k2": "k2", "low_var_kl": "low_var_kl", "k3_plus": "k3+"}


def inputs(seed: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(6, 9, generator=g, dtype=torch.float64) * 4 * scale).requires_grad_()
    ref = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 4 * scale
    return logps, ref


def value_and_grad(fn, logps, ref):
    out = fn(logps, ref)
    weights = torch.linspace(0.5, 1.5, out.numel(), dtype=torch.float64).view_as(out)  # a non-uniform upstream grad
    (grad,) = torch.autograd.grad((out * weights).sum(), logps)
    return out.detach(), grad


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [1.0, 12.0])  # 12: log ratios up to 48, past verl's clamps
@pytest.mark.parametrize("name", sorted(VERL_NAME))
def test_matches_verl_kl_penalty(seed, scale, name):
    logps, ref = inputs(seed, scale)
    got = value_and_grad(lambda a, b: kl_estimate(a, b, name), logps, ref)
    expected = value_and_grad(lambda a, b: verl_kl_penalty(a, b, VERL_NAME[name]), logps, ref)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [1.0, 12.0])
@pytest.mark.parametrize("name", sorted(VERL_NAME))
def test_matches_verls_released_kl_penalty(seed, scale, name):
    core_algos = pytest.importorskip(
        "verl.trainer.ppo.core_algos",
        reason="verl's released code is not installed: see docs/development.md, the verl reference line")
    logps, ref = inputs(seed, scale)
    got = value_and_grad(lambda a, b: kl_estimate(a, b, name), logps, ref)
    expected = value_and_grad(lambda a, b: core_algos.kl_penalty(a, b, VERL_NAME[name]), logps, ref)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [1.0, 12.0])
def test_default_k3_is_trls_estimator(seed, scale):
    logps, ref = inputs(seed, scale)
    got = value_and_grad(lambda a, b: kl_estimate(a, b), logps, ref)
    expected = value_and_grad(lambda a, b: trl_kl(b, a), logps, ref)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-12)


def test_k3_equals_verls_clamped_k3_inside_the_clamps_and_not_outside():
    logps, ref = inputs(0, 0.5)  # |log ratio| < 2: k3 < e^2 - 3 < 10, no clamp acts
    torch.testing.assert_close(kl_estimate(logps, ref, "k3"), verl_kl_penalty(logps, ref, "k3"), rtol=1e-12, atol=0)
    far = torch.tensor([[-30.0, -1.0]], dtype=torch.float64), torch.tensor([[-1.0, -30.0]], dtype=torch.float64)
    k3, verl_k3 = kl_estimate(*far, "k3"), verl_kl_penalty(*far, "k3")
    assert float(verl_k3.max()) == 10.0 and float(k3.max()) > 1e10  # control: TRL's k3 is not clamped


def test_estimators_differ_from_each_other():
    """Control: on the same tokens no two estimators agree in value or gradient (k3 and low_var_kl only past the
    clamps, so the inputs reach them)."""
    logps, ref = inputs(1, 12.0)
    results = {name: value_and_grad(lambda a, b, n=name: kl_estimate(a, b, n), logps, ref) for name in KL_ESTIMATORS}
    names = sorted(results)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            differs = [(results[first][k] - results[second][k]).abs().max() > 1e-6 for k in (0, 1)]
            assert any(differs), (first, second)
    torch.testing.assert_close(results["k3_plus"][0], results["low_var_kl"][0])  # k3+: low_var_kl's value ...
    torch.testing.assert_close(results["k3_plus"][1], results["k2"][1])  # ... and k2's gradient


def test_unknown_estimator_names_the_setting():
    logps, ref = inputs(0)
    with pytest.raises(ValueError, match="kl_estimator='k4'"):
        kl_estimate(logps, ref, "k4")


# --- in training -------------------------------------------------------------------------------------------------
def test_config_field_defaults_to_trls_and_refuses_an_unknown_estimator(tmp_path):
    from helpers import cpu_config

    assert cpu_config(tmp_path).kl_estimator == "k3"
    with pytest.raises(ValueError, match=r"kl_estimator='?k4'?: must be one of k1, k2, k3, k3_plus, low_var_kl"):
        cpu_config(tmp_path, kl_estimator="k4")


def test_the_loss_uses_the_configured_estimator(tmp_path):
    """``policy_loss``'s KL term (its per-token ``kl`` output) is the estimator's, for every estimator, with the
    default the k3 TRL computes; with ``kl_weighting: inside`` the estimator reads log(w pref / p)."""
    from sharpgrpo.training.loss.surrogates import kl_penalty

    logps, ref = inputs(2, 3.0)
    weights = torch.rand(logps.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5
    assert torch.equal(kl_penalty(ref, logps, None, "loss"), trl_kl(ref, logps))  # the default, bit for bit
    for name in KL_ESTIMATORS:
        torch.testing.assert_close(kl_penalty(ref, logps, weights, "loss", estimator=name),
                                   weights * kl_estimate(logps, ref, name), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kl_penalty(ref, logps, weights, "inside", estimator=name),
                                   kl_estimate(logps, ref + weights.log(), name), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_each_estimator_trains_two_steps(tiny_model_path, tmp_path):
    """Two steps with beta > 0 for each estimator: the first step's KL is 0 (policy = reference), the second's is the
    estimator's own (k1 can be negative, k2 and k3 differ), and each run's parameters move."""
    from helpers import make_trainer, tiny_config

    second_kl, moved = {}, {}
    for name in KL_ESTIMATORS:
        args = tiny_config(tmp_path / name, per_device_train_batch_size=8, num_generations=4, max_steps=2, beta=0.5,
                           kl_estimator=name, strategies="equal")
        trainer = make_trainer(tiny_model_path, args, train_dataset=16)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train()
        kls = [entry["kl"] for entry in trainer.state.log_history if "kl" in entry]
        assert len(kls) == 2 and kls[0] == pytest.approx(0.0, abs=1e-12), name
        second_kl[name] = kls[1]
        moved[name] = max(float((p - q).abs().max()) for p, q in zip(trainer.model.parameters(), before, strict=True))
    assert all(value > 0 for value in moved.values()), moved
    assert abs(second_kl["k2"] - second_kl["k3"]) > 1e-9 and abs(second_kl["k1"] - second_kl["k3"]) > 1e-9
    assert second_kl["k3_plus"] == pytest.approx(second_kl["low_var_kl"], rel=1e-6)  # its value is low_var_kl's
