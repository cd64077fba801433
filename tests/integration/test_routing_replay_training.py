"""Training the tiny MoE with routing replay (``routing_replay``; docs/methods.md §23): two real steps with two
iterations per generation batch, every loss forward checked against the routes stored with its rows; LoRA; and with
replay off, nothing installed and the same run as with replay where the routes agree."""

import math

import pytest
import torch
from helpers import make_trainer, tiny_config

from sharpgrpo import SharpGRPOTrainer
from sharpgrpo.training.generation.routing_replay import COMPLETION_KEY, PROMPT_KEY, find_routers, routing_replay

pytestmark = pytest.mark.slow

MOE_TRAINING = {"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 6, "max_steps": 2}


class CheckedTrainer(SharpGRPOTrainer):
    """Checks every loss forward: the experts each router's forward finally used (a hook behind the replay's) are the
    rows' stored routes wherever the token has one and the attention mask is 1."""

    checked = 0
    live_differs = 0

    def _compute_loss(self, model, inputs):
        replay = routing_replay(self)
        if not hasattr(self, "_spy"):
            self._spy = {}
            for layer, router in enumerate(replay.routers[0]):
                router.register_forward_hook(self._spy_hook(layer))
        self._spy.clear()
        loss = super()._compute_loss(model, inputs)
        routes = torch.cat([inputs[PROMPT_KEY], inputs[COMPLETION_KEY]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1).bool()
        replayed = attention & (routes[..., 0, 0] >= 0)
        assert set(self._spy) == set(range(routes.shape[2]))
        for layer, (used, live) in self._spy.items():
            used, live = used.view(*attention.shape, -1), live.view(*attention.shape, -1)
            assert torch.equal(used[replayed], routes[:, :, layer][replayed].long())
            self.live_differs += int((live.sort(-1).values != used.sort(-1).values).any(-1)[replayed].sum())
        self.checked += 1
        return loss

    def _spy_hook(self, layer):
        def hook(module, args, output):
            if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:  # the loss's forward
                logits, _, indices = output
                live = torch.topk(torch.softmax(logits.detach().float(), -1), module.top_k, dim=-1).indices
                self._spy[layer] = (indices.detach(), live)

        return hook


def test_replay_trains_and_every_loss_forward_uses_the_stored_routes(tiny_moe_path, tmp_path):
    import pyarrow.parquet as pq

    args = tiny_config(tmp_path, routing_replay=True, num_iterations=2, learning_rate=0.05, token_telemetry=True,
                       strategies=["grpo_sg"], **MOE_TRAINING)
    trainer = make_trainer(tiny_moe_path, args, trainer_class=CheckedTrainer)
    routers = [r.weight.detach().clone() for r in find_routers(trainer.model)]
    trainer.train()
    assert trainer.checked == 2  # one generation batch, trained on twice (num_iterations): one micro-batch a step
    assert trainer.live_differs > 0  # after an update the live router's choice differs: the replay did something
    after = find_routers(trainer.model)
    assert all(not torch.equal(r.weight, before) for r, before in zip(after, routers, strict=True))
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    for entry in logs:
        for key in ("loss", "grad_norm", "aux_loss", "routing_replay/agreement", "routing_replay/token_agreement"):
            assert math.isfinite(entry[key]), key
        assert 0 <= entry["routing_replay/token_agreement"] <= entry["routing_replay/agreement"] <= 1
    assert any(entry["routing_replay/agreement"] < 1 for entry in logs)
    table = pq.read_table(tmp_path / "telemetry" / "telemetry_000002.parquet").to_pandas()
    kept = table[table["mask"] == 1]
    agreement = kept["routing/agreement"]
    assert agreement.dropna().between(0, 1).all()
    # null only where the token had no route: each row's last sampled token, never fed back to the sampler
    assert agreement.isna().sum() <= kept["row"].nunique() < len(kept)
    # the same forward routed live: after an update the routes differ and replay changes log-probabilities; at step 1
    # (the sampling weights, float32) every route agrees and replay changes nothing, bit for bit
    change = (kept["logp"] - kept["routing/logp_without_replay"]).abs()
    assert change.notna().all() and change.max() > 1e-4
    first = pq.read_table(tmp_path / "telemetry" / "telemetry_000001.parquet").to_pandas()
    first = first[first["mask"] == 1]
    assert (first["routing/agreement"].dropna() == 1).all()
    assert (first["logp"] == first["routing/logp_without_replay"]).all()


def test_replay_off_installs_nothing_and_replay_on_agreeing_routes_changes_nothing(tiny_moe_path, tmp_path):
    """On-policy in float32 the sampler's routes are the trainer's own (agreement 1): replay then changes no loss,
    gradient norm or weight, bit for bit; with replay off no hook is on a router and no routes are stored."""
    runs = {}
    for replay in (False, True):
        args = tiny_config(tmp_path / str(replay), routing_replay=replay, strategies=["equal"], **MOE_TRAINING)
        trainer = make_trainer(tiny_moe_path, args)
        trainer.train()
        runs[replay] = trainer
    off, on = runs[False], runs[True]
    assert not hasattr(off, "_routing_replay")
    hooks = [h for module in off.model.modules() for h in [*module._forward_hooks.values(),
                                                          *module._forward_pre_hooks.values()]]
    assert not any("RoutingReplay" in getattr(h, "__qualname__", "") for h in hooks)
    assert any("RoutingReplay" in getattr(h, "__qualname__", "") for m in on.model.modules()
               for h in m._forward_hooks.values())  # the check above could fail
    assert all(PROMPT_KEY not in batch for batch in off._buffered_inputs or [] if batch)
    logs_on = [e for e in on.state.log_history if "loss" in e]
    logs_off = [e for e in off.state.log_history if "loss" in e]
    assert all(e["routing_replay/agreement"] == 1.0 for e in logs_on)
    for a, b in zip(logs_on, logs_off, strict=True):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])
    assert all(torch.equal(p, q) for p, q in zip(on.model.parameters(), off.model.parameters(), strict=True))


def test_lora_with_replay_trains_two_steps(tiny_moe_path, tmp_path):
    from peft import LoraConfig

    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset

    args = tiny_config(tmp_path, routing_replay=True, num_iterations=2, learning_rate=0.05, strategies=["grpo_sg"],
                       **MOE_TRAINING)
    trainer = SharpGRPOTrainer(model=tiny_moe_path, reward_funcs=[allowed_letters_reward], args=args,
                               train_dataset=demo_dataset(32),
                               peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if n in before)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    assert all(math.isfinite(e["loss"]) and math.isfinite(e["routing_replay/agreement"]) for e in logs)


@pytest.mark.multiprocess
def test_zero3_two_processes_with_replay_train_two_steps(tiny_moe_path, tmp_path):
    """DeepSpeed ZeRO-3 on two processes (every parameter partitioned, the routers included; TRL's own generation
    gathers them): routing replay trains two steps with finite metrics on every rank."""
    pytest.importorskip("deepspeed")
    from test_multiprocess import launch

    case = dict(generation="trl", routing_replay=True, strategies="grpo_sg", temperature=1.0, max_steps=2,
                per_device_train_batch_size=4, num_generations=4, max_completion_length=6)
    (ranks,) = launch(tiny_moe_path, tmp_path, [case], "configs/accelerate/zero3.yaml")
    for rank in ranks:
        assert rank["distributed_type"] == "DistributedType.DEEPSPEED"
        assert len(rank["log"]) == 2
        for entry in rank["log"]:
            for key in ("loss", "grad_norm", "routing_replay/agreement", "routing_replay/token_agreement"):
                assert math.isfinite(entry[key]), key


def half_the_prompts_constant_reward(prompts, completions, **kwargs):
    """0 for every completion of half the prompts (a group dynamic sampling drops), else one bit of the completion."""
    import zlib

    return [float(zlib.crc32(str(c).encode()) % 2) if zlib.crc32(str(p).encode()) % 2 else 0.0
            for p, c in zip(prompts, completions, strict=True)]


def test_dynamic_sampling_joins_the_rounds_routes(tiny_moe_path, tmp_path):
    """Dynamic sampling joins rows of several generation rounds (prompts left padded to the widest): the stored routes
    are joined the same way, and every loss forward still uses exactly them."""
    from sharpgrpo.data.demo import demo_dataset

    args = tiny_config(tmp_path, routing_replay=True, dynamic_sampling=True, strategies=["equal"],
                       **{**MOE_TRAINING, "max_steps": 2})
    trainer = CheckedTrainer(model=tiny_moe_path, reward_funcs=[half_the_prompts_constant_reward], args=args,
                             train_dataset=demo_dataset(64))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.checked == 2
    assert sum(entry["dynamic_sampling/extra_rounds"] for entry in logs) > 0  # rows of several rounds were joined
    assert all(math.isfinite(entry["routing_replay/agreement"]) for entry in logs)
