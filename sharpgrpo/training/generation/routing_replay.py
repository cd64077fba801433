"""Rollout routing replay for Hugging Face mixture-of-experts models (``routing_replay: true``; docs/methods.md §23).

The sampler and the trainer can route the same token to different experts (another kernel, another batch shape,
KV-cache decoding): the trainer then scores a token with a network the sampler never ran. Rollout routing replay (R3,
Ma et al. 2025, arXiv 2510.11370, §3) records the top-k experts the sampler chose for every token and MoE layer and
makes every training forward of that rollout use the same experts, with the gate weights recomputed from the live
router's logits so that the router keeps its gradient.

Recording. While TRL generates a batch with transformers' ``generate`` (:func:`routed_generation`, called by
``dynamic_sampling.generate_batch`` for every round), forward hooks on the routers keep each decoding forward's
expert ids: the prefill's for the prompt tokens, each step's for the token fed back; the last sampled token is never
fed back, so it has no route (-1: routed live; its output reaches no scored position). The routes travel with the
rollout as two generation-output tensors, ``prompt_routed_experts`` (B, P, L, K), left padded like ``prompt_ids``, and
``completion_routed_experts`` (B, C, L, K), right padded (L MoE layers, K = ``num_experts_per_tok``, int16, -1 where
there is no route), through TRL's shuffling and splitting to every micro-batch.

Replay. A pre-hook on the backbone takes, for each forward, the rows' routes; the hook on layer l's router replaces
``router_indices`` by the recorded ids where the token has a route and the attention mask is 1, and recomputes
``router_scores`` from the live ``router_logits`` as the router does (softmax in float32, the recorded experts'
probabilities, renormalised to sum 1 when ``norm_topk_prob``); ``router_logits`` are unchanged, so the
load-balancing loss (computed from them) is the live router's. Where the forward runs:

* inside a generation round (TRL's old and reference log-probabilities, computed before the output is returned), on
  the round's own routes, the rows taken in order (TRL scores them in chunks, once per model);
* in the loss (:func:`replayed_routes` around the trainer's forward: every micro-batch, every ``num_iterations``
  pass, the sharpness probe), on the micro-batch's routes;
* elsewhere (the advantage strategies' forwards after a round), on the last round's routes where the forward's
  tokens are that round's rows.
A forward's tokens are compared with the rollout's (where the attention mask is 1) before any route is replayed; a
forward inside a round or the loss whose tokens differ stops with one line. Gradient checkpointing recomputes a
layer in the backward: the router then gets the ids the forward used.

Agreement. In the loss, the hook also compares the live router's own top-k set with the recorded one per token and
layer; the fraction of layers that agree is the telemetry column ``routing/agreement`` and the step metrics
``routing_replay/agreement`` (tokens x layers) and ``routing_replay/token_agreement`` (tokens whose every layer
agrees), over loss tokens. With ``routing_replay: false`` nothing is installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sharpgrpo.training.telemetry.recorder import AGREEMENT_KEY, UNREPLAYED_KEY, is_telemetry_step
from sharpgrpo.validation import ConfigError

# AGREEMENT_KEY: (B, T) per completion token, NaN where nothing was replayed; UNREPLAYED_KEY: (B, T) the loss's log-p
# with live routing (telemetry steps only).

PROMPT_KEY, COMPLETION_KEY = "prompt_routed_experts", "completion_routed_experts"
NO_ROUTE = -1
ROUTE_DTYPE = torch.int16


def check_routing_replay_config(args) -> None:
    """What the config alone shows cannot give routes to replay: one line naming the field."""
    if not getattr(args, "routing_replay", False):
        return
    if args.use_vllm:
        raise ConfigError("routing_replay: the vLLM generation path returns no routes to sharpgrpo yet (vLLM's "
                          "routed_experts are not read); generate with transformers (use_vllm: false) or set "
                          "routing_replay: false. docs/moe.md.")
    if getattr(args, "use_transformers_paged", False):
        raise ConfigError("routing_replay: transformers' continuous batching (use_transformers_paged) packs the "
                          "requests, so no per-row routes are recorded; set use_transformers_paged: false.")
    if getattr(args, "async_generation", False):
        raise ConfigError("routing_replay: async_generation generates in another process, which records no "
                          "routes; set async_generation: false or routing_replay: false.")


def check_routing_replay_model(model_name: str, args) -> None:
    """Before the model loads (``train.py``'s input checks): with ``routing_replay``, a model whose config declares no
    experts per token (``num_experts_per_tok``: a dense model) is refused in one line. Read from its ``config.json``
    (a local folder, a prepared model, the Hub); where that cannot be read, the hooks' own check refuses it later."""
    if not getattr(args, "routing_replay", False):
        return
    from transformers import AutoConfig

    from sharpgrpo.models.prepared import resolve_model_name

    try:
        config = AutoConfig.from_pretrained(resolve_model_name(model_name))
    except (OSError, ValueError):
        return
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text, "num_experts_per_tok", None):
        raise ConfigError(f"routing_replay: {model_name!r} ({type(config).__name__}) is not a mixture-of-experts "
                          "model (its config declares no num_experts_per_tok), so it has no routes to replay; set "
                          "routing_replay: false or train an MoE model (e.g. sharpgrpo-tiny-moe).")


def find_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The top-k routers of a transformers MoE model, in layer order: modules named ``*TopKRouter`` with ``top_k``
    and ``num_experts`` (Qwen2-MoE, Qwen3-MoE, ...), whose forward returns (router_logits, router_scores,
    router_indices)."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")
            and hasattr(m, "top_k") and hasattr(m, "num_experts")]  # fmt: skip


def replayed_scores(router_logits: torch.Tensor, indices: torch.Tensor, norm_topk_prob: bool) -> torch.Tensor:
    """The gate weights of experts ``indices`` (N, K) under ``router_logits`` (N, E), as transformers' top-k routers
    compute them for their own top-k: softmax in float32, the chosen experts' probabilities, divided by their sum
    when ``norm_topk_prob``, cast to the logits' dtype (N, K). Differentiable in the logits."""
    probabilities = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    chosen = probabilities.gather(-1, indices.long())
    if norm_topk_prob:
        chosen = chosen / chosen.sum(dim=-1, keepdim=True)
    return chosen.to(router_logits.dtype)


def check_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model``'s routers (:func:`find_routers`), refused in one line where there are none (a dense model) or where
    one's gate weights are not :func:`replayed_scores` of its own choice (another routing function: it cannot be
    replayed by recomputing them). Checked on a few random tokens, before any hook is installed."""
    routers = find_routers(model)
    name = type(model).__name__
    if not routers:
        raise ConfigError(f"routing_replay: {name} has no mixture-of-experts router that sharpgrpo can hook "
                          "(transformers' *TopKRouter modules: Qwen2-MoE, Qwen3-MoE); a dense model has no routes to "
                          "replay; set routing_replay: false.")
    for router in routers:
        weight = getattr(router, "weight", None)
        if weight is None or weight.numel() == 0 or weight.device.type == "meta":  # ZeRO-3 shard: not checkable
            continue
        with torch.no_grad():
            generator = torch.Generator(device="cpu").manual_seed(0)
            probe = torch.randn(4, weight.shape[-1], generator=generator).to(weight.device, weight.dtype)
            out = router(probe)
            if not (isinstance(out, tuple) and len(out) == 3):
                raise ConfigError(f"routing_replay: {name}'s router {type(router).__name__} does not return "
                                  "(router_logits, router_scores, router_indices); it cannot be hooked.")
            logits, scores, indices = out
            expected = replayed_scores(logits, indices, bool(getattr(router, "norm_topk_prob", False)))
            if not torch.allclose(expected.float(), scores.float(), atol=1e-5, rtol=1e-4):
                raise ConfigError(f"routing_replay: {name}'s router {type(router).__name__} weighs its experts "
                                  "otherwise than softmax top-k; its scores cannot be recomputed for replayed "
                                  "experts.")
        break
    top_k = {int(r.top_k) for r in routers}
    if len(top_k) != 1:
        raise ConfigError(f"routing_replay: {name}'s routers choose different numbers of experts ({sorted(top_k)}).")
    return routers


@dataclass
class Routes:
    """A rollout's routes and tokens, rows in order: ``routes`` (B, W, L, K) int16 (-1: none), ``tokens`` (B, W)
    the token at each position (-1: unknown), ``offset`` the next row a chunked forward takes."""

    routes: torch.Tensor
    tokens: torch.Tensor
    offset: int = 0

    def rows(self, start: int, count: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``start``..``start + count`` at ``width`` positions (cut, or filled with -1)."""
        routes, tokens = self.routes[start:start + count], self.tokens[start:start + count]
        if routes.shape[1] >= width:
            return routes[:, :width], tokens[:, :width]
        missing = width - routes.shape[1]
        return (torch.cat([routes, routes.new_full((count, missing, *routes.shape[2:]), NO_ROUTE)], dim=1),
                torch.cat([tokens, tokens.new_full((count, missing), NO_ROUTE)], dim=1))


def _matches(tokens: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    known = tokens >= 0
    if attention_mask is not None:
        known &= attention_mask.bool().to(known.device)
    return bool((tokens.to(input_ids.device) == input_ids)[known.to(input_ids.device)].all())


class RoutingReplay:
    """The hooks on one trainer's models (the policy, and TRL's reference model where it loads one) and what they
    hold: the generation being recorded, the last round's routes, the loss micro-batch's routes, the agreement."""

    def __init__(self, models: list[torch.nn.Module]):
        self.routers = [check_routers(model) for model in models]
        self.num_layers = len(self.routers[0])
        self.top_k = int(self.routers[0][0].top_k)
        self.recording: list[dict[str, Any]] | None = None  # generation forwards of the round being generated
        self.round: Routes | None = None  # the last round's routes
        self.batch: Routes | None = None  # the loss micro-batch's routes (inside replayed_routes)
        self.strict = False  # inside a round or the loss: a forward that is not the rollout's stops the run
        self.active: tuple[torch.Tensor, torch.Tensor] | None = None  # this forward: routes (N, L, K), replay (N,)
        self.agreement: list[torch.Tensor | None] | None = None  # per layer (N,) in the loss
        self.used: dict[int, torch.Tensor] = {}  # per layer, the ids a forward with gradient used (recomputation)
        self._generation = False
        self.paused = False  # live routing everywhere (the telemetry's forward without replay)
        self._handles = []
        for model, routers in zip(models, self.routers, strict=True):
            backbone = getattr(model, model.base_model_prefix, model)
            self._handles.append(backbone.register_forward_pre_hook(self._forward_pre_hook, with_kwargs=True))
            for layer, router in enumerate(routers):
                self._handles.append(router.register_forward_hook(self._router_hook(layer)))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # hooks ------------------------------------------------------------------------------------------------------
    def _forward_pre_hook(self, module, args, kwargs):
        if torch._C._current_graph_task_id() != -1:  # gradient checkpointing's recomputation: no new forward
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        attention_mask = kwargs.get("attention_mask")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5 names the KV cache `cache`
        self.active, self._generation = None, cache is not None
        if self.paused:
            return
        if self._generation:
            if self.recording is not None:
                if cache.get_seq_length() == 0 or not self.recording:  # a prefill: a new generate call
                    self.recording.append({"ids": [], "mask": attention_mask, "layers": []})
                self.recording[-1]["ids"].append(input_ids.detach())
                self.recording[-1]["layers"].append([None] * self.num_layers)
            return
        if self.recording:  # the round's first scoring forward: the generation is over
            self.round = self._recorded_routes()
        source = self.batch if self.batch is not None else self.round
        if source is None or input_ids is None:
            return
        self.active = self._take(source, input_ids, attention_mask)

    def _take(self, source: Routes, input_ids: torch.Tensor, attention_mask):
        count, width = input_ids.shape
        total = source.routes.shape[0]
        for start in dict.fromkeys((source.offset % total, 0)):  # the next rows in order, else the first ones
            if start + count > total:
                continue
            routes, tokens = source.rows(start, count, width)
            if _matches(tokens, input_ids, attention_mask):
                source.offset = start + count
                replay = routes[..., 0, 0] >= 0
                if attention_mask is not None:
                    replay &= attention_mask.bool().to(replay.device)
                device = input_ids.device
                return routes.reshape(count * width, *routes.shape[2:]).to(device), replay.reshape(-1).to(device)
        if self.strict:
            raise ValueError(f"routing_replay: a forward of {count} rows x {width} tokens is not the rollout's "
                             f"({total} rows x {source.routes.shape[1]} tokens recorded): its tokens differ, so the "
                             "recorded routes cannot be replayed.")
        return None

    def _router_hook(self, layer: int) -> Callable:
        def hook(module, args, output):
            logits, scores, indices = output
            if self.paused:
                return None
            if self._generation:
                if self.recording is not None and self.recording:
                    self.recording[-1]["layers"][-1][layer] = indices.detach().to(ROUTE_DTYPE)
                return None
            if torch._C._current_graph_task_id() != -1:  # recomputation in the backward: the forward's choice
                used = self.used.get(layer)
                if used is None or used.shape[0] != indices.shape[0]:
                    return None
                return logits, replayed_scores(logits, used, module.norm_topk_prob), used
            if self.active is None:
                return None
            routes, replay = self.active
            if routes.shape[0] != indices.shape[0]:
                raise ValueError(f"routing_replay: MoE layer {layer} routed {indices.shape[0]} tokens, the forward "
                                 f"has {routes.shape[0]}.")
            recorded = routes[:, layer].long()
            if self.agreement is not None:
                same = (indices.sort(dim=-1).values == recorded.sort(dim=-1).values).all(dim=-1)
                self.agreement[layer] = same.float().masked_fill(~replay, float("nan"))
            chosen = torch.where(replay[:, None], recorded, indices)
            if torch.is_grad_enabled():
                self.used[layer] = chosen
            return logits, replayed_scores(logits, chosen, module.norm_topk_prob), chosen

        return hook

    # recording --------------------------------------------------------------------------------------------------
    def _recorded_routes(self) -> Routes:
        """The recorded generate call as rows of (P0 + steps - 1) positions: prompt (left padded as generate had it,
        which is TRL's padding) then completion; the last sampled token has no route."""
        recording, self.recording = self.recording, None
        if len(recording) != 1:
            raise ValueError(f"routing_replay: the round ran {len(recording)} generate calls; routes are recorded "
                             "for one generate call per round (tool calling and multi-turn rollouts are not "
                             "supported).")
        forwards = recording[0]
        per_forward = []
        for ids, layers in zip(forwards["ids"], forwards["layers"], strict=True):
            if any(indices is None for indices in layers):
                raise ValueError("routing_replay: a generation forward did not run every MoE router.")
            rows, length = ids.shape
            per_forward.append(torch.stack([i.view(rows, length, -1) for i in layers], dim=2))
        routes = torch.cat(per_forward, dim=1)
        tokens = torch.cat(forwards["ids"], dim=1).long()
        mask = forwards["mask"]
        if mask is not None:  # prompt padding: no token to compare, no route to keep
            prompt = mask.shape[1]
            tokens[:, :prompt] = tokens[:, :prompt].masked_fill(mask == 0, NO_ROUTE)
        return Routes(routes, tokens)

    @contextlib.contextmanager
    def generation(self):
        """Record the routes of one round's generate call and replay them in the round's scoring forwards."""
        self.recording, self.round, self.strict = [], None, True
        try:
            yield
        finally:
            if self.recording:  # generated, but nothing scored inside the round
                self.round = self._recorded_routes()
            self.recording, self.strict, self.active = None, False, None
            if self.round is not None:
                self.round.offset = 0

    def attach(self, output: dict[str, Any]) -> dict[str, Any]:
        """``output`` plus the round's routes in TRL's layout (module docstring)."""
        if self.round is None:
            raise ValueError("routing_replay: the generation recorded no routes (the routers never ran in "
                             "generate); this generation path cannot be replayed.")
        prompt, completion = output["prompt_ids"].shape[1], output["completion_ids"].shape[1]
        routes, tokens = self.round.rows(0, self.round.routes.shape[0], prompt + completion)
        if routes.shape[0] != output["prompt_ids"].shape[0] or not _matches(
                tokens, torch.cat([output["prompt_ids"], output["completion_ids"]], 1).to(tokens.device),
                torch.cat([output["prompt_mask"], output["completion_mask"]], 1)):
            raise ValueError("routing_replay: the recorded generation is not the round's output (rows or tokens "
                             "differ); its routes cannot be attached.")
        device = output["prompt_ids"].device
        return {**output, PROMPT_KEY: routes[:, :prompt].to(device), COMPLETION_KEY: routes[:, prompt:].to(device)}

    @contextlib.contextmanager
    def loss_batch(self, batch: dict[str, Any]):
        """Replay ``batch``'s routes in the forwards run inside; afterwards ``batch[AGREEMENT_KEY]`` holds the
        completion tokens' agreement (B, T): the fraction of MoE layers whose live top-k set is the recorded one."""
        prompt = batch["prompt_ids"]
        if PROMPT_KEY not in batch or COMPLETION_KEY not in batch:
            raise ValueError("routing_replay: this batch carries no routes (it was not generated by the trainer's "
                             "generation with routing_replay on), so there is nothing to replay.")
        routes = torch.cat([batch[PROMPT_KEY], batch[COMPLETION_KEY]], dim=1)
        tokens = torch.cat([prompt, batch["completion_ids"]], dim=1)
        expected = (self.num_layers, self.top_k)
        if tuple(routes.shape[2:]) != expected:
            raise ConfigError(f"routing_replay: the rollout's routes are {tuple(routes.shape[2:])} (layers, experts "
                              f"per token) and the model has {expected}; was num_experts_per_tok changed?")
        self.batch, self.strict, self.agreement = Routes(routes, tokens), True, [None] * self.num_layers
        try:
            yield
            width = tokens.shape[1]
            layers = [a for a in self.agreement if a is not None]
            if len(layers) == self.num_layers:
                per_token = torch.stack(layers, dim=-1).mean(dim=-1).view(-1, width)  # the last forward's rows
                if per_token.shape[0] == tokens.shape[0]:
                    batch[AGREEMENT_KEY] = per_token[:, prompt.shape[1]:]
        finally:
            self.batch, self.strict, self.agreement, self.active = None, False, None, None


def routing_replay(trainer) -> RoutingReplay:
    """The trainer's hooks, installed on first use (the policy's causal LM, and TRL's reference model where it has
    one); what cannot give routes is refused in one line."""
    replay = getattr(trainer, "_routing_replay", None)
    if replay is None:
        from sharpgrpo.training.generation.policy_inputs import causal_lm

        if trainer.tools or trainer.environment_factories is not None or trainer.rollout_func is not None:
            raise ConfigError("routing_replay: tool calling, environment_factory and rollout_func rollouts record no "
                              "routes (another generation path, or several generate calls per round); set "
                              "routing_replay: false.")
        models = [causal_lm(trainer.accelerator, trainer.model)]
        if getattr(trainer, "ref_model", None) is not None:
            models.append(causal_lm(trainer.accelerator, trainer.ref_model))
        replay = trainer._routing_replay = RoutingReplay(models)
    return replay


def routed_generation(trainer, generate: Callable[[list[dict]], dict], rows: list[dict]) -> dict:
    """``generate(rows)`` (TRL's generation of one round), with the routes recorded and attached when
    ``routing_replay`` is on; exactly ``generate(rows)`` otherwise."""
    if not trainer.args.routing_replay:
        return generate(rows)
    replay = routing_replay(trainer)
    with replay.generation():
        output = generate(rows)
    return replay.attach(output)


@contextlib.contextmanager
def replayed_routes(trainer, batch: dict[str, Any]):
    """Around the loss's forward: replay the micro-batch's routes (``routing_replay``), then append the routing
    agreement metrics; a no-op context when ``routing_replay`` is off."""
    if not trainer.args.routing_replay:
        yield
        return
    replay = routing_replay(trainer)
    with replay.loss_batch(batch):
        yield
    if _telemetry_step(trainer):  # the same forward routed live: what replay changed, token by token
        from sharpgrpo.training.generation.policy_inputs import prompt_completion

        replay.paused = True
        try:
            with torch.no_grad():
                batch[UNREPLAYED_KEY] = trainer._get_per_token_logps_and_entropies(
                    trainer.model, *prompt_completion(batch), batch["completion_ids"].size(1))[0].detach()
        finally:
            replay.paused = False
    agreement = batch.get(AGREEMENT_KEY)
    if agreement is not None:
        from sharpgrpo.training.generation.inputs import loss_mask
        from sharpgrpo.training.loss.metrics import global_masked_mean

        mask = loss_mask(batch) * ~agreement.isnan()
        values = agreement.nan_to_num(0.0)
        metrics = trainer._metrics["train" if trainer.model.training else "eval"]
        metrics["routing_replay/agreement"].append(global_masked_mean(trainer.accelerator, values, mask))
        metrics["routing_replay/token_agreement"].append(
            global_masked_mean(trainer.accelerator, (values == 1).float(), mask))


def _telemetry_step(trainer) -> bool:
    """A training micro-batch of a step that writes per-token telemetry (``token_telemetry``)."""
    if getattr(trainer, "_telemetry", None) is None or not trainer.model.training:
        return False
    return is_telemetry_step(trainer.state.global_step + 1, trainer.args)
