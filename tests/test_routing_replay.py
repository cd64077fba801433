"""Rollout routing replay (``routing_replay``; sharpgrpo.training.generation.routing_replay, docs/methods.md §23).

On the tiny MoE (``tiny_moe_path``: a 2-layer Qwen3-MoE, 4 experts, top-2): the routes recorded from transformers'
``generate`` are the ones the decoding forwards chose; a replayed forward uses exactly them for every token and layer
(checked by hooks of the test's own, behind the replay's), also under gradient checkpointing's recomputation, and
the router still gets a gradient; the agreement column is exact on a constructed case; bad input gets one line.
"""

from __future__ import annotations

import pytest
import torch

from sharpgrpo.training.generation.routing_replay import (
    AGREEMENT_KEY,
    COMPLETION_KEY,
    PROMPT_KEY,
    RoutingReplay,
    check_routing_replay_model,
    find_routers,
    replayed_scores,
)
from sharpgrpo.validation import ConfigError

PROMPTS = [[60, 61, 62], [70, 71, 72, 73, 74], [80, 81]]


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


class RouterSpy:
    """Forward hooks registered after the replay's: what each router's forward finally returned (the ids the experts
    used) and the live router's own top-k of the same logits, per layer, for every forward."""

    def __init__(self, model):
        self.used, self.live = [], []
        self.handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(find_routers(model))]

    def _hook(self, layer):
        def hook(module, args, output):
            logits, _, indices = output
            if layer == 0:
                self.used.append({})
                self.live.append({})
            probs = torch.softmax(logits.detach(), dim=-1, dtype=torch.float)
            self.used[-1][layer] = indices.detach().clone()
            self.live[-1][layer] = torch.topk(probs, module.top_k, dim=-1).indices

        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()


def rollout(model, replay, seed=0, new_tokens=6):
    """A TRL-shaped generation output (left-padded prompts, completions masked after EOS) with its routes attached;
    also the spy's per-forward record of the generation."""
    from trl.trainer.utils import pad

    prompts = [torch.tensor(p) for p in PROMPTS]
    ids = pad(prompts, padding_value=0, padding_side="left")
    mask = pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left")
    spy = RouterSpy(model)
    torch.manual_seed(seed)
    with replay.generation(), torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=True,
                             pad_token_id=0)
    spy.remove()
    completion = out[:, ids.shape[1]:]
    is_eos = completion == model.generation_config.eos_token_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion.shape[1])
    completion_mask = (torch.arange(completion.shape[1])[None] <= first[:, None]).long()
    batch = {"prompt_ids": ids, "prompt_mask": mask, "completion_ids": completion.masked_fill(completion_mask == 0, 0),
             "completion_mask": completion_mask}
    return replay.attach(batch), spy


def replayed_positions(batch):
    routes = torch.cat([batch[PROMPT_KEY], batch[COMPLETION_KEY]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1).bool()
    return routes, attention & (routes[..., 0, 0] >= 0)


def test_replayed_scores_are_the_routers_gate_weights_of_the_given_experts():
    """Against a float64 loop: softmax over experts, the chosen ones, renormalised (norm_topk_prob) or not."""
    generator = torch.Generator().manual_seed(0)
    for norm in (True, False):
        logits = torch.randn(7, 6, generator=generator, dtype=torch.float64) * 3
        indices = torch.stack([torch.randperm(6, generator=generator)[:3] for _ in range(7)])
        got = replayed_scores(logits.float(), indices, norm)
        for n in range(7):
            exp = [float(torch.exp(logits[n, e] - logits[n].max())) for e in range(6)]
            probs = [v / sum(exp) for v in exp]
            chosen = [probs[int(e)] for e in indices[n]]
            if norm:
                chosen = [c / sum(chosen) for c in chosen]
            assert torch.allclose(got[n].double(), torch.tensor(chosen, dtype=torch.float64), atol=1e-6)


def test_recorded_routes_are_the_generation_forwards_choice(tiny_moe_path):
    model = _load(tiny_moe_path)
    replay = RoutingReplay([model])
    batch, spy = rollout(model, replay)
    routes, replayed = replayed_positions(batch)
    rows, prompt = batch["prompt_ids"].shape
    layers = len(find_routers(model))
    assert routes.shape[2:] == (layers, 2)
    # the prefill's choice for the prompt positions, each decoding step's for the token it fed back
    for layer in range(layers):
        prefill = spy.used[0][layer].view(rows, prompt, 2)
        assert torch.equal(routes[:, :prompt, layer].long(), prefill)
        for step, forward in enumerate(spy.used[1:]):
            assert torch.equal(routes[:, prompt + step, layer].long(), forward[layer])
    assert (routes[:, prompt + len(spy.used) - 1:] == -1).all()  # the last sampled token was never fed back
    assert replayed[:, prompt:].any()


def test_the_training_forward_uses_exactly_the_recorded_experts_and_the_router_learns(tiny_moe_path):
    model = _load(tiny_moe_path)
    replay = RoutingReplay([model])
    batch, _ = rollout(model, replay)
    routes, replayed = replayed_positions(batch)
    with torch.no_grad():  # another router: its own top-k now differs from the sampler's for many tokens
        for router in find_routers(model):
            router.weight.add_(torch.randn_like(router.weight) * 2.0)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    model.train()
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.zero_grad()
        spy = RouterSpy(model)
        with replay.loss_batch(batch):
            out = model(input_ids=input_ids, attention_mask=attention, output_router_logits=True)
            loss = out.logits.float().logsumexp(-1).mean() + out.aux_loss
        loss.backward()
        spy.remove()
        differs = False
        for layer, used in spy.used[0].items():
            used = used.view(*input_ids.shape, 2)
            assert torch.equal(used[replayed], routes[:, :, layer][replayed].long())
            live = spy.live[0][layer].view(*input_ids.shape, 2)
            differs |= bool((live.sort(-1).values != used.sort(-1).values).any(-1)[replayed].any())
        assert differs  # the replay changed something: the test could fail
        if checkpointing:  # the recomputation in the backward used the forward's experts too
            assert all(torch.equal(f[layer], spy.used[0][layer]) for f in spy.used[1:] for layer in f)
        router_grads = [r.weight.grad.clone() for r in find_routers(model)]
        assert all(g is not None and g.abs().sum() > 0 for g in router_grads)
        grads.append(router_grads)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))


def test_agreement_is_the_fraction_of_layers_whose_live_routes_are_the_recorded_ones(tiny_moe_path):
    """Recorded routes built from the model's own routing with chosen tokens' last-layer experts changed to another
    set (the last layer's choice changes no router's input): the agreement of each completion token is 1 - changed
    layers / layers, exactly; NaN where no route."""
    model = _load(tiny_moe_path)
    replay = RoutingReplay([model])
    batch, _ = rollout(model, replay)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    spy = RouterSpy(model)
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention)
    spy.remove()
    layers = len(spy.live[0])
    live = torch.stack([spy.live[0][layer].view(*input_ids.shape, 2) for layer in range(layers)], dim=2)
    generator = torch.Generator().manual_seed(1)
    changed = torch.zeros(*input_ids.shape, layers, dtype=torch.bool)
    changed[..., -1] = torch.rand(*input_ids.shape, generator=generator) < 0.4
    others = torch.stack([torch.tensor([e for e in range(4) if e not in set(pair.tolist())]) for pair in
                          live.view(-1, 2)]).view_as(live)  # the two experts the router did not choose
    constructed = torch.where(changed[..., None], others, live).to(torch.int16)
    prompt = batch["prompt_ids"].shape[1]
    constructed[:, -1] = -1  # a position without a route
    batch = {**batch, PROMPT_KEY: constructed[:, :prompt], COMPLETION_KEY: constructed[:, prompt:]}
    with torch.no_grad(), replay.loss_batch(batch):
        model(input_ids=input_ids, attention_mask=attention)
    expected = 1.0 - changed.double().mean(-1)[:, prompt:]
    got = batch[AGREEMENT_KEY]
    known = batch["completion_mask"].bool() & (constructed[:, prompt:, 0, 0] >= 0)
    assert torch.equal(got[known].double(), expected[known])
    assert got[~known].isnan().all()
    assert 0 < float(got[known].mean()) < 1


def test_bad_inputs_are_refused_in_one_line(tiny_moe_path, tmp_path):
    from helpers import cpu_config
    from transformers import AutoModelForCausalLM, Qwen2Config

    dense_model = AutoModelForCausalLM.from_config(Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64,
                                                               num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ConfigError, match="Qwen2ForCausalLM has no mixture-of-experts router") as dense:
        RoutingReplay([dense_model])
    model = _load(tiny_moe_path)
    replay = RoutingReplay([model])
    batch, _ = rollout(model, replay)
    wider = {**batch, PROMPT_KEY: torch.cat([batch[PROMPT_KEY]] * 2, dim=-1)[..., :3],
             COMPLETION_KEY: torch.cat([batch[COMPLETION_KEY]] * 2, dim=-1)[..., :3]}  # num_experts_per_tok 3
    with pytest.raises(ConfigError, match="num_experts_per_tok") as shape:
        with replay.loss_batch(wider):
            pass
    replay.remove()
    router = find_routers(model)[0]
    forward = router.forward
    router.forward = lambda h: (lambda out: (out[0], torch.sigmoid(out[0]).gather(1, out[2]), out[2]))(forward(h))
    with pytest.raises(ConfigError, match="otherwise than softmax top-k") as other:
        RoutingReplay([model])
    with pytest.raises(ConfigError, match="vLLM generation path returns no routes") as vllm:
        cpu_config(tmp_path, routing_replay=True, use_vllm=True)
    with pytest.raises(ConfigError, match="async_generation") as asynchronous:
        cpu_config(tmp_path, routing_replay=True, async_generation=True)
    dense_model.config.save_pretrained(tmp_path / "dense")  # before the model loads: train.py reads its config
    with pytest.raises(ConfigError, match="is not a mixture-of-experts model") as before_load:
        check_routing_replay_model(str(tmp_path / "dense"), cpu_config(tmp_path, routing_replay=True))
    check_routing_replay_model(tiny_moe_path, cpu_config(tmp_path, routing_replay=True))
    for error in (dense, shape, other, vllm, asynchronous, before_load):
        assert "\n" not in str(error.value)
