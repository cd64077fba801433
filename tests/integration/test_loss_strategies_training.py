"""The loss-side strategies inside SharpGRPOTrainer: GMPO against TRL 1.16's own GMPO trainer, the host reads the
strategies add, and a few real training steps of the tiny model with each of them.

GMPO parity: ``trl.experimental.gmpo.GMPOTrainer`` (TRL 1.16.0, ``trl/experimental/gmpo/gmpo_trainer.py``,
``_compute_loss``) and ``SharpGRPOTrainer`` with ``strategies: gmpo``, ``loss_type: grpo`` get the same model and the
same batch (random ragged completions, off-policy old log-probabilities, reference log-probabilities; the inputs of
tests/integration/test_parity.py) and must give the same loss and parameter gradients. TRL's GMPO uses its config's
``epsilon``/``epsilon_high`` (default 0.4) in log space; ours reads ``gmpo_epsilon_low``/``_high`` (default 0.4); TRL's
GMPO ignores ``use_bias_correction_kl``, so the KL cases set it false (ours then warns about nothing).
"""

import pytest
import torch
from helpers import binary_letters_reward, make_trainer, tiny_config
from test_parity import HostReads, assert_same, build, loss_and_grads, make_inputs
from trl import GRPOConfig, GRPOTrainer
from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer

GMPO_CASES = [
    dict(beta=0.0),
    # the KL term, TRL's entropy mask inside the geometric mean, and a clip range that clips some tokens (the inputs'
    # log ratios have std 0.3)
    dict(beta=0.04, use_bias_correction_kl=False, top_entropy_quantile=0.5, epsilon=0.1, epsilon_high=0.15),
]


@pytest.mark.parametrize("options", GMPO_CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_gmpo_matches_trl_gmpo_trainer(tiny_model_path, tmp_path, options):
    parent = build(GMPOTrainer, GMPOConfig, tiny_model_path, tmp_path / "parent", **options)
    ours = {k: v for k, v in options.items() if k not in ("epsilon", "epsilon_high")}
    sharp = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "sharp", strategies="gmpo",
                  loss_type="grpo", gmpo_epsilon_low=parent.epsilon_low, gmpo_epsilon_high=parent.epsilon_high,
                  **ours)
    sharp.model.load_state_dict(parent.model.state_dict())
    inputs = make_inputs(parent, seed=4, off_policy=True, with_ref=options["beta"] > 0)
    assert_same(loss_and_grads(parent, inputs, accumulation=2), loss_and_grads(sharp, inputs, accumulation=2))
    # TRL's own clip metrics agree too (ours from GMPO's clip range in ratio terms)
    for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert sharp._metrics["train"][name] == pytest.approx(parent._metrics["train"][name], abs=1e-7)
    if "epsilon" in options:
        assert parent._metrics["train"]["clip_ratio/region_mean"][0] > 0


def host_reads(trainer, inputs, monkeypatch):
    """Host reads of one micro-batch's loss, in the steady state (the second call: nothing cached)."""
    for _ in range(2):
        trainer.current_gradient_accumulation_steps = 1
        reads = HostReads(monkeypatch)
        trainer._compute_loss(trainer.model, dict(inputs))
        monkeypatch.undo()
    return reads.count


def test_loss_strategies_add_at_most_one_host_read_per_micro_batch(tiny_model_path, tmp_path, monkeypatch):
    """The strategies' selections stay on the device (counts, ranks); their metrics are read in one synchronisation
    per micro-batch beyond TRL's own."""
    parent = build(GRPOTrainer, GRPOConfig, tiny_model_path, tmp_path / "parent", loss_type="dapo")
    inputs = make_inputs(parent, 3)
    parent_reads = host_reads(parent, inputs, monkeypatch)
    for strategies in (["clip_cov", "kl_cov"], "dppo_kl"):
        sharp = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "sharp", loss_type="dapo",
                      strategies=strategies)
        assert host_reads(sharp, inputs, monkeypatch) <= parent_reads + 1, strategies


def test_dppo_and_clip_cov_change_the_gradient_of_equal_off_policy(tiny_model_path, tmp_path):
    """Off-policy (r != 1) each strategy's gradient differs from the unmodified loss's, and only where it says."""
    base = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "base", strategies="equal",
                 loss_type="bnpo")
    inputs = make_inputs(base, 5, sampled=True)  # sampled tokens: probabilities far from 0, TV differences ~0.1
    _, base_grads = loss_and_grads(base, inputs, 1)
    # dppo_keep_clip: the mask on top of PPO's clip, so the difference is the mask's, not the clip's removal
    for strategy, extra in (("dppo_tv", dict(dppo_keep_clip=True, dppo_tv_low=0.02, dppo_tv_high=0.02)),
                            ("clip_cov", dict(clip_cov_lb=-10.0, clip_cov_ratio=0.3))):
        sharp = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / strategy, strategies=strategy,
                      loss_type="bnpo", **extra)
        sharp.model.load_state_dict(base.model.state_dict())
        _, grads = loss_and_grads(sharp, inputs, 1)
        assert any(not torch.allclose(grads[n], base_grads[n]) for n in grads), strategy
        metric = "dppo/frac_masked" if strategy == "dppo_tv" else "clip_cov/frac_selected"
        assert sharp._metrics["train"][metric][0] > 0, strategy


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategies", "options", "metrics"),
    [
        ("clip_cov", dict(clip_cov_ratio=0.05, clip_cov_lb=0.0), ["clip_cov/frac_selected", "clip_cov/mean_cov"]),
        ("kl_cov", dict(kl_cov_ratio=0.05), ["kl_cov/frac_selected", "kl_cov/abs_log_ratio_selected"]),
        ("dppo_tv", dict(dppo_tv_low=0.01, dppo_tv_high=0.01), ["dppo/frac_masked", "dppo/mean_abs_prob_diff"]),
        ("dppo_kl", dict(loss_type="cispo", epsilon_high=5.0), ["dppo/frac_masked", "dppo/mean_binary_kl"]),
        ("gmpo", dict(loss_type="grpo"), ["gmpo/sequence_ratio_mean", "clip_ratio/region_mean"]),
        (["grpo_sg", "dppo_tv"], {}, ["dppo/frac_masked", "token_weight/mean"]),
        (["cw_grpo", "clip_cov", "kl_cov"], dict(kl_cov_ratio=0.05), ["cw/weight_mean", "kl_cov/frac_selected"]),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, list) else None,
)
def test_loss_strategy_trains_off_policy_and_logs(tiny_model_path, tmp_path, strategies, options, metrics):
    """Three optimizer steps of the tiny model, two updates per generation batch (num_iterations=2: the second is
    off-policy, where these strategies act); parameters change, the strategies' metrics are logged and finite."""
    args = tiny_config(tmp_path, strategies=strategies, max_steps=3, num_iterations=2, **options)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3
    for name in metrics:
        values = [entry[name] for entry in logs if name in entry]
        # the loss's metrics every step; an advantage strategy's at generation steps (every second step here)
        assert len(values) == (2 if name.startswith("cw/") else 3), name
        assert all(torch.isfinite(torch.tensor(values))), (name, values)
    if strategies in ("dppo_tv", "clip_cov", "kl_cov"):
        assert max(entry[metrics[0]] for entry in logs) > 0  # the strategy selected or masked some token


# Loss strategies whose terms are functions of each token or sequence alone (not of micro-batch statistics, as
# Clip-Cov's and KL-Cov's selections are, like verl's), so that two processes train exactly as one.
TWO_PROCESS_CASES = {
    "dppo_tv": dict(strategies="dppo_tv", dppo_tv_low=0.02, dppo_tv_high=0.02, num_iterations=2),
    "gmpo": dict(strategies="gmpo", loss_type="grpo", gmpo_epsilon_low=0.05, gmpo_epsilon_high=0.05,
                 num_iterations=2),
}


@pytest.mark.slow
@pytest.mark.multiprocess  # an `accelerate launch` of two processes
def test_two_processes_train_as_one(tiny_model_path, tmp_path):
    """``accelerate launch`` with two CPU processes (gloo; tests/integration/test_multiprocess.py's worker, a group split
    between the ranks), off-policy (num_iterations=2): per step the loss, grad norm and reward of one process with
    the whole batch; the strategies' metrics are logged on every rank."""
    from _launch_worker import run_case
    from test_multiprocess import NUM_PROCESSES, PER_DEVICE, assert_same_training, launch

    cases = [dict(case, per_device_train_batch_size=PER_DEVICE, max_steps=3) for case in TWO_PROCESS_CASES.values()]
    results = launch(tiny_model_path, tmp_path / "two", cases, "configs/accelerate/multi_gpu.yaml")
    for (name, case), ranks in zip(TWO_PROCESS_CASES.items(), results, strict=True):
        assert ranks[0]["distributed_type"] == "DistributedType.MULTI_CPU"
        single = run_case(tiny_model_path, str(tmp_path / name), **case,
                          per_device_train_batch_size=PER_DEVICE * NUM_PROCESSES, max_steps=3)
        assert_same_training(ranks[0], single)
        metric = "dppo/frac_masked" if name == "dppo_tv" else "gmpo/sequence_ratio_mean"
        assert all(metric in entry for rank in ranks for entry in rank["log"])
        if name == "dppo_tv":
            assert max(entry[metric] for entry in single["log"]) > 0  # the second update of a batch masks tokens
