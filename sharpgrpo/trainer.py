"""``SharpGRPOTrainer``: TRL's ``GRPOTrainer`` with pluggable token-level strategies.

Tested with trl==1.16.0 (pinned in pyproject.toml). The trainer overrides four points of the parent:

* ``_generate_and_score_completions``: after TRL has generated, scored and normalised a generation batch, it
  tags every row with its group id and index in the group (so group structure survives TRL's shuffling and
  splitting) and runs the advantage strategies once, on whole groups gathered from every process, replacing
  ``advantages`` (B,) by token advantages (B, T);
* ``_compute_loss``: TRL's policy loss for every TRL 1.16 loss type (surrogates in ``sharpgrpo.losses``), with the
  token weight of the weight strategy placed in the ratio or the loss and in the KL term (METHODS §1), keeping
  TRL's entropy mask, off-policy mask, vLLM importance-sampling ratio, entropy bonus and metric names. With the
  ``equal`` strategy it equals the parent's loss and gradients (tests/integration/test_parity.py);
* ``_calculate_rewards``: unchanged, but the trainer keeps the rewards for strategies that need them, and the
  verdicts of the reward functions' answer checks for strategies that need "correct" (``sharpgrpo.correctness``).
* ``_generate_single_turn``: unchanged, but with transformers' ``generate`` it reads the sampling log-probabilities
  and last hidden states that advantage strategies need from the decoding steps (`sharpgrpo.generation_capture`), so
  no second forward runs; on-policy ``ar`` is applied in ``_compute_loss`` instead (``_folded_ar``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import replace
from typing import Any

import torch
from trl import GRPOTrainer

from sharpgrpo.config import SharpGRPOConfig
from sharpgrpo.correctness import answer_verdicts, correct_completions
from sharpgrpo.generation_capture import GenerationCapture, fit_width, logps_from_hidden_states
from sharpgrpo.lifecycle import LifecycleCallback, resolve_resume_checkpoint, warn_if_off_boundary
from sharpgrpo.losses import PPO_CLIP_LOSS_TYPES, weighted_policy_surrogate
from sharpgrpo.model_card import STRATEGY_PAPERS, fix_card_links, strategies_bibtex, strategy_card_section
from sharpgrpo.strategies import STRATEGIES, AdvantageStrategy, GenerationBatch, TokenWeightStrategy
from sharpgrpo.strategies.probability_shaping import ARTokenAdvantages, ar_token_advantages
from sharpgrpo.validation import StrategyOutputChecker, checked_reward_functions
from sharpgrpo.vllm_seeding import colocated_vllm_seed, refuse_vllm_request_seed, server_request_seed

STRATEGY_STATE_NAME = "sharpgrpo_strategy_state.pt"  # strategy state in each checkpoint (see `_save_rng_state`)

def prompt_completion(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of the prompts followed by their completions (TRL's batch layout)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return input_ids, attention_mask


class SharpGRPOTrainer(GRPOTrainer):
    """[`trl.GRPOTrainer`] whose policy loss is changed by the strategies named in ``args.strategies``.

    Takes the same arguments as ``GRPOTrainer``; ``args`` must be a [`SharpGRPOConfig`].
    """

    _tag_names = ["trl", "grpo", "sharpgrpo"]
    base_model_name: str | None = None  # the model card's base model where TRL sees only a local folder
    _name = "SharpGRPO"

    def __init__(self, model, reward_funcs=None, args: SharpGRPOConfig | None = None, **kwargs):
        if args is None:
            args = SharpGRPOConfig(output_dir="sharpgrpo-output")
        if not isinstance(args, SharpGRPOConfig):
            raise TypeError(f"SharpGRPOTrainer needs a SharpGRPOConfig, got {type(args).__name__}.")
        strategies = [STRATEGIES.get(name)(args) for name in args.strategies]
        self.weight_strategy: TokenWeightStrategy | None = next(
            (s for s in strategies if s.kind == "weight"), None
        )
        self.advantage_strategies: list[AdvantageStrategy] = [s for s in strategies if s.kind == "advantage"]
        self._strategy_output_checker = StrategyOutputChecker(args.strategies)  # shape, finite, w > 0; names it
        self._last_rewards_per_func: torch.Tensor | None = None
        self._last_answer_verdicts: torch.Tensor | None = None
        self._generation_count = 0
        self._generation_captured: dict[str, torch.Tensor] = {}  # see `_generate_single_turn`
        refuse_vllm_request_seed(args)
        super().__init__(model, checked_reward_functions(reward_funcs), args, **kwargs)  # every batch's output
        self._refuse_unsupported()
        self.add_callback(LifecycleCallback(self))  # signals, complete-checkpoint markers, non-finite stop
        if self.use_vllm and self.vllm_mode == "colocate":
            self._seed_colocated_vllm()
        first_paper = next((STRATEGY_PAPERS[n] for n in args.strategies if n in STRATEGY_PAPERS), None)
        if first_paper is not None:
            self._paper = first_paper

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` (or "true") takes the newest *complete* checkpoint
        and a named one is checked for damaged files first (`sharpgrpo.lifecycle`)."""
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        warn_if_off_boundary(resume_from_checkpoint, self.args)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _get_grad_norm(self, model, grad_norm=None):
        self.last_grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)  # checked by LifecycleCallback
        return self.last_grad_norm

    def _refuse_unsupported(self) -> None:
        """Combinations whose semantics the strategies would silently change are refused here, at construction."""
        if self.advantage_strategies and self.environment_factories is not None:
            raise ValueError("Advantage strategies are not supported with `environment_factory` rollouts.")
        if self.advantage_strategies and self.tools:
            raise ValueError("Advantage strategies are not supported with tool calling (tool_mask).")

    # ------------------------------------------------------------------------------------------------------------
    # vLLM sampling seeds (see `refuse_vllm_request_seed` for why TRL's defaults ignore the training seed)
    # ------------------------------------------------------------------------------------------------------------
    def _seed_colocated_vllm(self) -> None:
        """Reseed this process's random streams from ``seed`` after TRL started the colocated vLLM engine.

        The engine runs inside the training process and samples every request that carries no seed of its own from
        the global torch/numpy/random streams, which its start-up reseeded with ``process_index // tp`` (TRL's engine
        seed): without this, runs that differ only in ``seed`` sample the same completions.
        """
        from accelerate.utils import set_seed

        set_seed(
            colocated_vllm_seed(
                self.args.seed, self.accelerator.process_index, self.args.vllm_tensor_parallel_size
            )
        )

    def _server_generation_kwargs(self) -> dict[str, Any]:
        """The vLLM ``generation_kwargs`` of the next server request: the user's, plus a ``seed`` derived from
        ``seed`` and the generation index unless the user gave one.

        The server samples the ``num_generations`` completions of a prompt as one request with ``n = G``, for which
        vLLM derives a distinct seed per completion (seed + index), so the group stays diverse; a new seed per
        generation batch keeps batches independent, and the training seed makes runs with different seeds differ
        (the server's own engine seed is fixed when it starts)."""
        kwargs = dict(self.args.generation_kwargs or {})
        if "seed" not in kwargs:
            kwargs["seed"] = server_request_seed(self.args.seed, self._generation_count)
        return kwargs

    # ------------------------------------------------------------------------------------------------------------
    # Generation: group tags and advantage strategies
    # ------------------------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # gathered over all processes, global row order
        self._last_answer_verdicts = None  # local rows: the answer checks' verdicts (sharpgrpo.correctness)
        if any(s.needs_correctness for s in self.advantage_strategies):
            columns = {key: [example[key] for example in inputs] for key in inputs[0]
                       if key not in ("prompt", "completion", "completion_ids")}
            self._last_answer_verdicts = answer_verdicts(
                self.reward_funcs, prompts, completions,
                {**columns, "completion_ids": completion_ids_list, "trainer_state": self.state},
            )
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.use_vllm and self.vllm_mode == "server":
            self.vllm_generation.generation_kwargs = self._server_generation_kwargs()
        self._generation_captured = {}
        self._rollout_inputs = inputs  # read by rollout functions (e.g. sharpgrpo.search) for per-row metadata
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        local_rows = output["completion_ids"].size(0)
        device = output["completion_ids"].device
        # TRL orders the generation batch globally by process, then by local row, and normalises rewards over
        # consecutive blocks of `num_generations` rows: that block is the group.
        global_rows = torch.arange(local_rows, device=device) + self.accelerator.process_index * local_rows
        groups_per_batch = local_rows * self.accelerator.num_processes // num_generations
        output = {
            **output,
            "group_ids": global_rows // num_generations + self._generation_count * groups_per_batch,
            "group_index": global_rows % num_generations,
        }
        self._generation_count += 1
        if self._generation_strategies():
            output["advantages"] = self._apply_advantage_strategies(output, num_generations, mode)
        return output

    def _trl_computes_old_logps(self) -> bool:
        """TRL 1.16's condition for computing ``old_per_token_logps`` at generation (off-policy or vLLM IS)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every != 0 or (
            self.use_vllm and self.vllm_importance_sampling_correction
        )

    def _folded_ar(self) -> ARTokenAdvantages | None:
        """The `ar` strategy when it is applied in the loss instead of at generation: on-policy (TRL computes no
        old log-probabilities, so the loss's own detached log-probabilities are p_old) and last in the list (no
        later advantage strategy reads its output). Its factor f > 0 then commutes with min/clip: exactly equal."""
        last = self.advantage_strategies[-1] if self.advantage_strategies else None
        if isinstance(last, ARTokenAdvantages) and not self._trl_computes_old_logps():
            return last
        return None

    def _generation_strategies(self) -> list[AdvantageStrategy]:
        folded = self._folded_ar()
        return [s for s in self.advantage_strategies if s is not folded]

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation, with the sampling log-probabilities and last hidden states read from transformers'
        ``generate`` when a strategy needs them (`sharpgrpo.generation_capture`; no second forward)."""
        strategies = self._generation_strategies()
        logps = any(s.needs_old_logps for s in strategies) and not self._trl_computes_old_logps()
        hidden = any(s.needs_hidden_states for s in strategies)
        if not (logps or hidden) or not self.args.generation_capture or self.use_vllm or (
            self.use_transformers_continuous_batching
        ):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        with GenerationCapture(self._causal_lm(), self.temperature, logps=logps, hidden=hidden) as capture:
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                                     num_generations, has_tool_images)
        self._generation_captured = capture.result(completion_ids)
        return completion_ids, logprobs

    @torch.no_grad()
    def _apply_advantage_strategies(self, output: dict[str, Any], num_generations: int, mode: str) -> torch.Tensor:
        """Run the advantage strategies on whole groups gathered from all processes; return local (B, T)."""
        if "pixel_values" in output:
            raise ValueError("Advantage strategies do not support multimodal inputs.")
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        local_rows, local_length = completion_ids.shape
        strategies = self._generation_strategies()
        captured = {k: fit_width(v, local_length) for k, v in self._generation_captured.items()
                    if v.shape[0] == local_rows}
        self._generation_captured = {}
        hidden_states = None
        if any(s.needs_hidden_states for s in strategies):
            hidden_states = captured["hidden"] if "hidden" in captured else self._completion_hidden_states(output)
        old_logps = output.get("old_per_token_logps")
        if old_logps is None and any(s.needs_old_logps for s in strategies):  # TRL skips them on-policy
            sampling = output.get("sampling_per_token_logps")  # vLLM's own log-probabilities
            if "logps" in captured:
                old_logps = captured["logps"]
            elif sampling is not None and not bool(torch.isnan(sampling).any()):
                old_logps = sampling
            elif hidden_states is not None:  # the backbone forward THR ran serves the log-probabilities too
                with self._full_unembedding() as (weight, bias):
                    old_logps = logps_from_hidden_states(hidden_states, completion_ids, weight, bias,
                                                         self.temperature, self.args.per_device_train_batch_size)
            else:
                old_logps = self._sampling_logps(output)

        def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
            if self.accelerator.num_processes == 1:
                return tensor
            if tensor.dim() > 1:
                tensor = self.accelerator.pad_across_processes(tensor, dim=1, pad_index=0)
            return self.accelerator.gather(tensor.contiguous())

        rewards_per_func = self._last_rewards_per_func
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = torch.nan_to_num((rewards_per_func * weights.unsqueeze(0)).nansum(dim=1), nan=0.0)
        advantages = gather_rows(output["advantages"]) if output["advantages"].dim() == 1 else None
        if advantages is None:
            raise ValueError("Advantage strategies expect TRL's sequence advantages of shape (B,).")
        if output.get("tool_mask") is not None:  # tool results / retrieved text (env_mask): no strategy statistic
            completion_mask = completion_mask * output["tool_mask"]
        mask = gather_rows(completion_mask)
        group_ids = gather_rows(output["group_ids"])
        correct = None
        if any(s.needs_correctness for s in self.advantage_strategies):
            verdicts = self._last_answer_verdicts
            verdicts = None if verdicts is None else gather_rows(verdicts.to(mask.device))
            correct = correct_completions(verdicts, rewards.to(mask.device), advantages.float(), group_ids)
        with self._full_unembedding(hidden_states is not None) as unembedding:
            batch = GenerationBatch(
                old_logps=None if old_logps is None else gather_rows(old_logps.float()),
                completion_mask=mask,
                completion_ids=gather_rows(completion_ids),
                advantages=advantages.float().unsqueeze(1).expand_as(mask).clone(),
                rewards=rewards.to(mask.device).float(),
                group_ids=group_ids,
                num_generations=num_generations,
                hidden_states=None if hidden_states is None else gather_rows(hidden_states),
                unembedding_weight=unembedding[0],
                unembedding_bias=unembedding[1],
                temperature=self.temperature,
                correct=correct,
            )
            token_advantages = batch.advantages
            for strategy in strategies:
                result = strategy.token_advantages(replace(batch, advantages=token_advantages))
                self._strategy_output_checker.advantages(strategy, result, batch)
                token_advantages, metrics = result
                for name, value in metrics.items():
                    self._metrics[mode][name].append(float(value))
                if self.args.thr_debug_dump and getattr(strategy, "last_scores", None) is not None:
                    self._dump_token_scores(strategy, batch, token_advantages)
        start = self.accelerator.process_index * local_rows
        return token_advantages[start : start + local_rows, :local_length].contiguous()

    def _dump_token_scores(self, strategy, batch: GenerationBatch, token_advantages: torch.Tensor) -> None:
        """Write one JSON line per completion (decoded tokens, THR scores, advantages) for inspection."""
        if not self.accelerator.is_main_process:
            return
        import json

        folder = os.path.join(self.args.output_dir, "thr_scores")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"generation_{self._generation_count:06d}.jsonl")
        scores, advantages = strategy.last_scores.float().cpu(), token_advantages.float().cpu()
        masks, completion_ids = batch.completion_mask.bool().cpu(), batch.completion_ids.cpu()
        group_ids, rewards = batch.group_ids.tolist(), batch.rewards.tolist()
        with open(path, "w", encoding="utf-8") as file:
            for row, valid in enumerate(masks):
                record = {
                    "global_step": self.state.global_step,
                    "group_id": group_ids[row],
                    "reward": rewards[row],
                    "tokens": [self.processing_class.decode([i]) for i in completion_ids[row][valid].tolist()],
                    "scores": scores[row][valid].tolist(),
                    "advantages": advantages[row][valid].tolist(),
                }
                file.write(json.dumps(record) + "\n")

    def _sampling_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """Log-probabilities of the completion under the current (= sampling) policy; TRL skips them on-policy."""
        input_ids, attention_mask = prompt_completion(output)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.model,
            input_ids,
            attention_mask,
            output["completion_ids"].size(1),
            batch_size=self.args.per_device_train_batch_size,
        )
        return logps

    def _causal_lm(self):
        model = self.accelerator.unwrap_model(self.model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def _completion_hidden_states(self, output: dict[str, Any]) -> torch.Tensor:
        """(B, T, H) last-layer hidden states at the positions that predict each completion token.

        TRL's forward returns neither hidden states nor full logits, so the backbone runs here (no gradient, in
        chunks of ``per_device_train_batch_size`` rows).
        """
        causal_lm = self._causal_lm()
        backbone = getattr(causal_lm, causal_lm.base_model_prefix)
        input_ids, attention_mask = prompt_completion(output)
        length = output["completion_ids"].size(1)
        chunks = []
        step = self.args.per_device_train_batch_size
        for start in range(0, input_ids.size(0), step):
            hidden = backbone(
                input_ids=input_ids[start : start + step], attention_mask=attention_mask[start : start + step]
            ).last_hidden_state
            chunks.append(hidden[:, -length - 1 : -1])
        return torch.cat(chunks, dim=0)

    @contextlib.contextmanager
    def _full_unembedding(self, needed: bool = True):
        """Yield the LM head's (weight (V, H), bias (V,) or None), whole for the duration of the block.

        Under DeepSpeed ZeRO-3 a parameter outside its module's forward is an empty placeholder (shape (0,)), so
        the head is gathered (read-only) on every process; all processes must enter the block together.
        """
        if not needed:
            yield None, None
            return
        head = self._causal_lm().get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if self.is_deepspeed_enabled and plugin is not None and plugin.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([p for p in (weight, bias) if p is not None], modifier_rank=None):
                yield weight, bias
        else:
            yield weight, bias

    # ------------------------------------------------------------------------------------------------------------
    # Loss
    # ------------------------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self._sharpness_probe_due():
            self._run_sharpness_probe(model, inputs)
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._pinned_weights = None  # the probe's weights serve this micro-batch's training loss only

    def _sharpness_probe_due(self) -> bool:
        steps = self.args.sharpness_probe_steps
        if not steps or not self.model.training or self.state.global_step % steps != 0:
            return False
        return getattr(self, "_last_probe_step", None) != self.state.global_step

    def _run_sharpness_probe(self, model, inputs) -> None:
        """SAM-style sharpness on the first micro-batch of every `sharpness_probe_steps`-th step (parameters and
        the random streams are restored exactly; the probe's own loss passes do not add loss metrics).

        The loss is the micro-batch loss times the accumulation steps, i.e. on the scale of a whole step's loss.
        The token weights are drawn once, by the probe's first loss pass, and reused by its ascent pass and by the
        training loss of the same micro-batch (``_pinned_weights``): the ascent measures the loss the step
        optimises, and a `random` run with the probe draws exactly the weights of a run without it.
        """
        from sharpgrpo.diagnostics.sharpness import sharpness_probe

        self._last_probe_step = self.state.global_step
        self._pin_next_weights = True
        saved_metrics = {key: list(values) for key, values in self._metrics["train"].items()}
        # The probe's loss passes must not step the adaptive entropy controller either.
        saved_entropy = (self.entropy_coef, self._last_world_entropy, self._entropy_window_stats)
        scale = self.current_gradient_accumulation_steps
        result = sharpness_probe(
            self.accelerator.unwrap_model(model),
            lambda: self._compute_loss(model, inputs) * scale,
            self.args.sharpness_rho,
            grad_reduce=(lambda g: self.accelerator.reduce(g, "mean")) if self.accelerator.num_processes > 1 else None,
        )
        self._metrics["train"].clear()
        self._metrics["train"].update(saved_metrics)
        self.entropy_coef, self._last_world_entropy, self._entropy_window_stats = saved_entropy
        for key, value in result.items():
            self._metrics["train"][key].append(value)

    def _compute_loss(self, model, inputs):
        """TRL 1.16 ``GRPOTrainer._compute_loss`` for every loss type, with token weights (METHODS §1)."""
        args = self.args
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids, attention_mask = prompt_completion(inputs)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        forward_keys = (
            "pixel_values",
            "image_grid_thw",
            "num_images",
            "pixel_attention_mask",
            "spatial_shapes",
            "num_tiles",
            "image_sizes",
            "token_type_ids",
            "mm_token_type_ids",
            "image_position_ids",
        )
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in forward_keys},
        )
        entropy_mask = (
            self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
            if self.top_entropy_quantile < 1.0
            else None
        )
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        folded_ar = self._folded_ar()
        if folded_ar is not None:  # AR-Lopti in the loss: p_old = the loss's own detached probabilities
            ar_factor = ar_token_advantages(per_token_logps.detach().exp(), 1.0, folded_ar.args.ar_alpha)
            advantages = ar_factor * advantages
        old_per_token_logps = inputs.get("old_per_token_logps")
        old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        if self.off_policy_mask_threshold is not None:
            off_policy_mask = self.get_off_policy_mask(
                advantages=advantages,
                per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_per_token_logps),
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )

        log_ratio = per_token_logps - old_per_token_logps
        level = self.importance_sampling_level
        if level == "token":
            log_importance_weights = log_ratio
        else:
            sequence_log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
            if level == "sequence":
                log_importance_weights = sequence_log_ratio
            else:  # "sequence_token" (GSPO-token): value of the sequence ratio, gradient of each token
                log_importance_weights = sequence_log_ratio.detach() + per_token_logps - per_token_logps.detach()
        coef_1 = torch.exp(log_importance_weights)

        weights = bad_weights = None
        if self.weight_strategy is not None:
            weights = getattr(self, "_pinned_weights", None)
            if weights is None:
                weights = self.weight_strategy.weights(per_token_logps.detach(), mask)
                checker = self._strategy_output_checker  # values read with the weight metrics, one sync in all
                bad_weights = checker.weights(self.weight_strategy, weights, per_token_logps, mask)
                weights = weights.detach()
                if getattr(self, "_pin_next_weights", False):
                    self._pinned_weights, self._pin_next_weights = weights, False

        if self.beta != 0.0:
            ref_logp_minus_logp = inputs["ref_per_token_logps"] - per_token_logps
            if weights is not None and args.kl_weighting == "inside":  # TR-GRPO Eq. 11: k3 of w*pref/p
                ref_logp_minus_logp = ref_logp_minus_logp + torch.log(weights)
            per_token_kl = torch.exp(ref_logp_minus_logp) - ref_logp_minus_logp - 1
            if weights is not None and args.kl_weighting == "loss":  # GRPO-SG Lemma 3.4: beta * w * kl
                per_token_kl = weights * per_token_kl
            if args.use_bias_correction_kl:
                per_token_kl = per_token_kl * coef_1

        phi_seq = None
        if self.loss_type == "vespo":  # TRL's gamma weight of the sequence ratio (the parent's own method)
            phi_seq = self.get_gamma_weights(
                advantages=advantages,
                log_ratio_per_token=log_ratio,
                mask=mask,
                importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
                k_pos=args.vespo_k_pos,
                lambda_pos=args.vespo_lambda_pos,
                k_neg=args.vespo_k_neg,
                lambda_neg=args.vespo_lambda_neg,
            )
        per_token_loss, surrogate_ratio = weighted_policy_surrogate(
            self.loss_type,
            coef_1,
            advantages,
            per_token_logps,
            weights,
            args.weight_placement,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            delta=args.delta,
            sapo_temperature_pos=args.sapo_temperature_pos,
            sapo_temperature_neg=args.sapo_temperature_neg,
            phi_seq=phi_seq,
        )

        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * off_policy_mask
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type != "vespo":
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]  # VESPO has it inside phi
        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * per_token_kl

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        normalizer = accumulation  # per-micro-batch losses; the dapo family below is per accumulation window
        if self.loss_type in ("grpo", "sapo"):
            loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        elif self.loss_type == "bnpo":
            loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
        elif self.loss_type == "dr_grpo":
            loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)
        elif self.loss_type == "luspo":  # each sequence's loss times its length
            loss = (per_token_loss * mask).sum(-1).mean()
        elif self.loss_type in ("dapo", "cispo", "vespo"):  # already normalised per accumulation window
            tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                tokens = tokens * self.current_gradient_accumulation_steps / args.steps_per_generation
            loss = (per_token_loss * mask).sum() / tokens
            normalizer = 1.0
        else:  # refused by SharpGRPOConfig; kept so that a future loss type cannot pass silently
            raise ValueError(f"Unsupported loss type: {self.loss_type}")
        policy_loss = loss.detach()
        loss = loss / normalizer

        if self._entropy_bonus_enabled:
            effective_mask = mask if entropy_mask is None else mask * entropy_mask
            loss = loss - self._entropy_bonus(entropies, effective_mask, policy_loss, mode)

        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        self._log_loss_metrics(mode, mask, entropies, coef_1, advantages, per_token_kl if self.beta else None, phi_seq)
        if folded_ar is not None:
            self._metrics[mode]["ar/factor_mean"].append(self._global_masked_mean(ar_factor, mask))
        if weights is not None:
            clipped_ratio = surrogate_ratio if self.loss_type in PPO_CLIP_LOSS_TYPES else None
            bad = self._log_weight_metrics(mode, mask, weights, clipped_ratio, advantages, bad_weights)
            if bad:
                self._strategy_output_checker.raise_for_weights(self.weight_strategy, weights, per_token_logps, mask)
        return loss

    def _entropy_bonus(self, entropies, effective_mask, policy_loss, mode) -> torch.Tensor:
        """TRL 1.16's entropy bonus (``entropy_coef``, adaptive with ``use_adaptive_entropy``, Skywork-OR1): the
        coefficient times the mean entropy over ``effective_mask``, scaled for gradient accumulation only (the same
        for every loss type); the caller subtracts it. Adaptive control applies the coefficient of the previous
        optimizer step and updates it from the accumulation window's token-weighted mean entropy over all processes.
        """
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
        if self.use_adaptive_entropy:
            apply_coef = self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
        else:
            apply_coef = self.entropy_coef
        self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                delta = self.args.entropy_coef_delta
                if world_entropy <= self.args.entropy_target:
                    self.entropy_coef = min(self.entropy_coef + delta, self.args.entropy_coef_max)
                else:
                    self.entropy_coef = max(self.entropy_coef - delta, self.args.entropy_coef_min)
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return apply_coef * entropy_loss

    # ------------------------------------------------------------------------------------------------------------
    # Metrics (reduced over processes like TRL's: a value per micro-batch, averaged at logging time)
    # ------------------------------------------------------------------------------------------------------------
    def _global_masked_mean(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        if values.shape[1] == 1:  # one value per sequence
            local = torch.stack([values.sum(), torch.tensor(float(values.shape[0]), device=values.device)])
        else:
            local = torch.stack([(values * mask).sum(), mask.sum().float()])
        totals = self.accelerator.reduce(local, reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def _log_loss_metrics(self, mode, mask, entropies, coef_1, advantages, per_token_kl, phi_seq=None) -> None:
        """TRL's own metric names and definitions (kl, entropy, clip_ratio/*, cispo_clip_ratio, vespo/phi_seq_mean),
        computed on the unweighted ratio."""
        from trl.trainer.utils import nanmax, nanmin

        metrics = self._metrics[mode]
        if per_token_kl is not None:
            metrics["kl"].append(self._global_masked_mean(per_token_kl, mask))
        metrics["entropy"].append(self._global_masked_mean(entropies, mask))
        if self.loss_type == "cispo":
            is_clipped = ((coef_1 > self.epsilon_high) & (advantages > 0)).float()
            metrics["cispo_clip_ratio"].append(self._global_masked_mean(is_clipped, mask))
        if self.loss_type == "vespo":
            metrics["vespo/phi_seq_mean"].append(self._global_masked_mean(phi_seq, mask))
        if self.loss_type not in PPO_CLIP_LOSS_TYPES:
            return
        is_low = ((coef_1 < 1 - self.epsilon_low) & (advantages < 0)).float()
        is_high = ((coef_1 > 1 + self.epsilon_high) & (advantages > 0)).float()
        metrics["clip_ratio/low_mean"].append(self._global_masked_mean(is_low, mask))
        metrics["clip_ratio/high_mean"].append(self._global_masked_mean(is_high, mask))
        metrics["clip_ratio/region_mean"].append(self._global_masked_mean(torch.maximum(is_low, is_high), mask))

        def per_sequence(x):
            return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

        metrics["clip_ratio/low_min"].append(nanmin(self.accelerator.gather(per_sequence(is_low))).item())
        metrics["clip_ratio/high_max"].append(nanmax(self.accelerator.gather(per_sequence(is_high))).item())

    def _log_weight_metrics(self, mode, mask, weights, surrogate_ratio, advantages, bad_weights=None) -> int:
        """``token_weight/*``: statistics of w over valid tokens, and the share of tokens the clip switched off
        (``surrogate_ratio`` is None for surrogates without PPO's clip, which switch no token off: logged as 0).
        Returns ``bad_weights`` (the checker's device count of invalid weights), read in the same synchronisation."""
        metrics = self._metrics[mode]
        valid = mask.bool()
        w = weights.float()
        count = valid.sum().float()
        lower, upper = self.weight_strategy.bounds()
        at_lower = (w <= lower + 1e-6).float()
        at_upper = (w >= upper - 1e-6).float()
        # A token gets no policy gradient when min() picks the clipped branch and the clip is active.
        grad_clipped = torch.zeros_like(w)
        if surrogate_ratio is not None:
            grad_clipped = (
                ((surrogate_ratio > 1 + self.epsilon_high) & (advantages > 0))
                | ((surrogate_ratio < 1 - self.epsilon_low) & (advantages < 0))
            ).float()
        local = torch.stack(
            [
                (w * mask).sum(),
                (w * w * mask).sum(),
                count,
                (at_lower * mask).sum(),
                (at_upper * mask).sum(),
                (grad_clipped.expand_as(w) * mask).sum(),
            ]
        )
        totals = self.accelerator.reduce(local, reduction="sum")
        n = totals[2].clamp(min=1.0)
        mean = totals[0] / n
        # With no valid token the extremes are +inf and -inf, which the min over processes ignores.
        local_extremes = torch.stack([w.masked_fill(~valid, float("inf")).min(),
                                      -w.masked_fill(~valid, float("-inf")).max()])
        extremes = self.accelerator.gather(local_extremes.unsqueeze(0)).min(dim=0).values
        zero = mean.new_zeros(())
        values = torch.stack([  # read with one host synchronisation
            mean, (totals[1] / n - mean * mean).clamp(min=0.0).sqrt(), extremes[0], -extremes[1],
            totals[3] / n, totals[4] / n, totals[5] / n, zero if bad_weights is None else bad_weights.float(),
        ]).tolist()
        names = ("mean", "std", "min", "max", "frac_at_lower", "frac_at_upper", "frac_grad_clipped")
        for name, value in zip(names, values[:-1], strict=True):
            metrics[f"token_weight/{name}"].append(value)
        return int(values[-1])

    # ------------------------------------------------------------------------------------------------------------
    # Strategy state in checkpoints
    # ------------------------------------------------------------------------------------------------------------
    def strategy_state(self) -> dict[str, dict]:
        strategies = ([self.weight_strategy] if self.weight_strategy else []) + self.advantage_strategies
        return {type(s).__name__: s.state_dict() for s in strategies}

    def load_strategy_state(self, state: dict[str, dict]) -> None:
        strategies = ([self.weight_strategy] if self.weight_strategy else []) + self.advantage_strategies
        for strategy in strategies:
            if type(strategy).__name__ in state:
                strategy.load_state_dict(state[type(strategy).__name__])

    def _strategy_state_path(self, checkpoint: str) -> str:
        """``sharpgrpo_strategy_state.pt``, or one ``sharpgrpo_strategy_state_{process}.pt`` per process (like
        transformers' ``rng_state_{process}.pth``): each process advances its own state, e.g. the `random` generator
        draws for that process's micro-batches only."""
        if self.args.world_size <= 1:
            return os.path.join(checkpoint, STRATEGY_STATE_NAME)
        return os.path.join(checkpoint, f"sharpgrpo_strategy_state_{self.args.process_index}.pt")

    def _save_rng_state(self, output_dir):
        # Saved with the random states: by every process, and before `hub_strategy` "checkpoint"/"all_checkpoints"
        # starts uploading the checkpoint folder (writing it after `_save_checkpoint` would race that upload).
        super()._save_rng_state(output_dir)
        state = {"strategies": self.strategy_state(), "generation_count": self._generation_count}
        torch.save(state, self._strategy_state_path(output_dir))

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
        if checkpoint is None:
            return
        path = self._strategy_state_path(checkpoint)
        if not os.path.exists(path):  # resumed with another number of processes: reuse process 0's state
            candidates = [os.path.join(checkpoint, n) for n in (STRATEGY_STATE_NAME, "sharpgrpo_strategy_state_0.pt")]
            found = [c for c in candidates if os.path.exists(c)]
            if not found:
                return
            warnings.warn(
                f"{os.path.basename(path)} is not in {checkpoint}; loading {os.path.basename(found[0])} instead "
                "(the checkpoint was saved by another number of processes): strategy state such as the `random` "
                "weight generator will not continue exactly.",
                stacklevel=2,
            )
            path = found[0]
        try:  # weights_only: never unpickle code from a checkpoint (tensors, numbers, strings, lists, dicts only)
            state = torch.load(path, weights_only=True)
        except Exception as error:  # noqa: BLE001 - damaged file or a refused type: reported with the path
            raise ValueError(
                f"Cannot load the strategy state {path}: {type(error).__name__}: {str(error).splitlines()[0]}. "
                "It is damaged, or a strategy's state_dict() holds objects other than tensors, numbers, strings, "
                "lists and dicts (refused: loading them would run code)."
            ) from None
        if "strategies" in state:
            self._generation_count = int(state.get("generation_count", self._generation_count))
            state = state["strategies"]
        self.load_strategy_state(state)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, base_model: str | None = None):
        """TRL's model card, plus a section naming the strategies, their parameters and papers.

        Before the Hub repository exists (``push_to_hub=False``, or offline) TRL's card says "None" for the model
        name and repository; here they default to ``hub_model_id`` (else the output folder's name), as TRL's own
        checkpoint cards do. ``base_model`` (e.g. ``train.py``'s ``model_name_or_path``) names the base model where
        TRL sees only a local folder; only hub ids are linked, and a local or registered dataset name is not
        linked to the Hub. The citation block holds BibTeX entries of the strategies' papers."""
        if model_name is None:
            model_name = self.args.hub_model_id or os.path.basename(os.path.normpath(self.args.output_dir))
            model_name = model_name.split("/")[-1]
        created_repo_id = self.hub_model_id
        self.hub_model_id = created_repo_id or self.args.hub_model_id  # only for the card: push_to_hub still creates
        paper = self._paper
        self._paper = {**paper, "citation": strategies_bibtex(self.args.strategies) or paper.get("citation")}
        try:
            super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        finally:
            self.hub_model_id = created_repo_id
            self._paper = paper
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, "README.md")
        with open(path, encoding="utf-8") as card:
            text = card.read()
        repo_id = self.hub_model_id or self.args.hub_model_id
        text = fix_card_links(text, base_model or self.base_model_name, dataset_name, repo_id, self.args.output_dir)
        with open(path, "w", encoding="utf-8") as card:
            card.write(text + "\n" + self.strategy_card_section())

    def strategy_card_section(self) -> str:
        """Markdown: each configured strategy with its parameters and the paper it implements."""
        return strategy_card_section(self.args)
