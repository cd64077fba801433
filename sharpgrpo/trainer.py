"""``SharpGRPOTrainer``: TRL's ``GRPOTrainer`` with pluggable token-level strategies (tested with trl==1.16.0).

Glue only: the strategies (`sharpgrpo.strategies`), the loss's pure functions (`sharpgrpo.training.losses`), its metrics
(`sharpgrpo.training.loss_metrics`), the policy inputs of advantage strategies (`sharpgrpo.training.policy_inputs`), the advantage
pipeline (`sharpgrpo.training.advantage_pipeline`), checkpoint state (`sharpgrpo.training.strategy_state`), the lifecycle
(`sharpgrpo.run.lifecycle`) and the model card (`sharpgrpo.training.model_card`) live in their own modules. Overridden:

* ``_generate_and_score_completions`` (TRL): after TRL has generated, scored and normalised a generation batch, tag
  every row with its group id and index in the group (so group structure survives TRL's shuffling and splitting)
  and run the advantage strategies once, on whole groups gathered from every process, replacing ``advantages`` (B,)
  by token advantages (B, T). The inner hooks ``_calculate_rewards`` and ``_generate_single_turn`` (TRL) record the
  rewards, the answer checks' verdicts and the values read from the decoding steps in one ``GenerationRecord``.
* ``_compute_loss`` (TRL): TRL's policy loss for every TRL 1.16 loss type with the weight strategy's token weight
  placed in the ratio or the loss and in the KL term (docs/methods.md §1), keeping TRL's entropy mask, off-policy
  mask, vLLM importance-sampling ratio, entropy bonus and metric names; the loss strategies' terms (masks, extra
  terms, per-token clip range and KL factor, a sequence objective) are folded in by `sharpgrpo.training.loss_terms`.
  With ``equal`` it equals the parent's loss and gradients (tests/integration/test_parity.py). ``compute_loss`` (transformers) runs the sharpness probe first.
* With ``token_telemetry``, both hooks hand their tensors, detached, to the telemetry recorder
  (`sharpgrpo.training.telemetry`), which writes them per token on telemetry steps.
* ``train``, ``_get_grad_norm``, ``_save_rng_state``, ``_load_rng_state`` (transformers) and ``create_model_card``
  (TRL): resume checks, the non-finite-gradient stop, strategy state in checkpoints, the strategies on the card.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, ClassVar

import torch
from transformers.utils import logging
from trl import GRPOTrainer

from sharpgrpo.config import SharpGRPOConfig
from sharpgrpo.models.prepared import resolve_model_name
from sharpgrpo.models.source import record_base_model
from sharpgrpo.run.lifecycle import LifecycleCallback, resolve_resume_checkpoint, warn_if_off_boundary
from sharpgrpo.strategies import STRATEGIES, AdvantageStrategy, TokenLossStrategy, TokenWeightStrategy
from sharpgrpo.strategies.base import LossContext
from sharpgrpo.strategies.correctness import answer_verdicts
from sharpgrpo.training.advantage_pipeline import (
    GenerationRecord,
    gathered_batch,
    run_advantage_strategies,
    split_folded,
    tag_groups,
)
from sharpgrpo.training.entropy_bonus import entropy_bonus
from sharpgrpo.training.entropy_inputs import refuse_unavailable_sampling_entropy, strategy_loss_weights
from sharpgrpo.training.generation_capture import GenerationCapture, fit_width
from sharpgrpo.training.launch_check import check_launch, check_launch_request
from sharpgrpo.training.logps_temperature import score_logps_at
from sharpgrpo.training.loss_metrics import (
    append_metrics,
    global_masked_mean,
    loss_metrics,
    process_means,
    weight_metrics,
)
from sharpgrpo.training.loss_terms import (
    apply_token_terms,
    clip_range,
    collect_loss_terms,
    per_token_terms,
    sequence_objective_loss,
    weighted_kl,
)
from sharpgrpo.training.losses import (
    WINDOW_NORMALISED_LOSS_TYPES,
    aggregate_loss,
    kl_penalty,
    log_importance_weights,
    weighted_policy_surrogate,
    window_token_share,
)
from sharpgrpo.training.model_card import trl_paper, write_model_card
from sharpgrpo.training.output_checks import StrategyOutputChecker, checked_reward_functions
from sharpgrpo.training.policy_inputs import (
    Policy,
    causal_lm,
    old_logps_source,
    prompt_completion,
    sampling_truncation,
    vllm_logps_problem,
)
from sharpgrpo.training.rank_agreement import RankFailures
from sharpgrpo.training.score_dump import dump_token_scores
from sharpgrpo.training.sharded_head import averaged_head_gradient
from sharpgrpo.training.sharpness import SharpnessProbe
from sharpgrpo.training.strategy_state import load_strategy_state, save_strategy_state, strategy_state_path
from sharpgrpo.training.telemetry import (
    attach_generation,
    replace_folded_advantages,
    replace_logged_advantages,
    sequence_means,
    telemetry_recorder,
)
from sharpgrpo.training.vllm_seeding import refuse_vllm_request_seed, seed_colocated_vllm, server_generation_kwargs

logger = logging.get_logger(__name__)

# Model inputs besides ids and mask that TRL's forward passes on (multimodal models).
FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


class SharpGRPOTrainer(GRPOTrainer):
    """[`trl.GRPOTrainer`] whose policy loss is changed by the strategies named in ``args.strategies``.

    Takes the same arguments as ``GRPOTrainer``; ``args`` must be a [`SharpGRPOConfig`].
    """

    _tag_names: ClassVar[list[str]] = ["trl", "grpo", "sharpgrpo"]
    base_model_name: str | None = None  # the model card's base model where TRL sees only a local folder
    _name = "SharpGRPO"

    def __init__(self, model, reward_funcs=None, args: SharpGRPOConfig | None = None, **kwargs):
        if args is None:
            args = SharpGRPOConfig(output_dir="sharpgrpo-output")
        if not isinstance(args, SharpGRPOConfig):
            raise TypeError(f"SharpGRPOTrainer needs a SharpGRPOConfig, got {type(args).__name__}.")
        classes = {name: STRATEGIES.get(name) for name in args.strategies}
        strategies = [classes[name](args) for name in args.strategies]
        self.weight_strategy: TokenWeightStrategy | None = next((s for s in strategies if s.kind == "weight"), None)
        self.advantage_strategies: list[AdvantageStrategy] = [s for s in strategies if s.kind == "advantage"]
        self.loss_strategies: list[TokenLossStrategy] = [s for s in strategies if s.kind == "loss"]
        self._strategy_output_checker = StrategyOutputChecker(classes)  # shape, finite, w > 0; names it
        self._generation = GenerationRecord()  # filled by the generation hooks, read by the advantage strategies
        self._generation_count = 0
        self._sharpness = SharpnessProbe(args.sharpness_probe_steps, args.sharpness_rho)
        refuse_vllm_request_seed(args)
        prepared_name = None
        if isinstance(model, str) and resolve_model_name(model) != model:  # a prepared model (sharpgrpo-tiny)
            prepared_name, model = model, resolve_model_name(model)  # -> its folder, built on first use
        # FSDP asked for on the CPU (or FSDP1 with THR): refused before accelerate builds something else
        head_readers = [name for name, cls in classes.items() if getattr(cls, "needs_hidden_states", False)]
        check_launch_request(args, head_readers=head_readers)
        self._rank_failures = RankFailures()  # a reward error on one process: all stop together (rank_agreement)
        super().__init__(model, self._rank_failures.wrap(checked_reward_functions(reward_funcs)), args, **kwargs)
        self._rank_failures.active = self.accelerator.num_processes > 1
        check_launch(self.accelerator, args)  # FSDP/DeepSpeed/processes as the launcher asked, in one line
        if prepared_name is not None:  # the card and a saved adapter name the model as given, not a cache folder
            self.base_model_name = self.base_model_name or prepared_name
            record_base_model(self.model, prepared_name)
        if self.advantage_strategies and self.environment_factories is not None:
            raise ValueError("Advantage strategies are not supported with `environment_factory` rollouts.")
        if self.advantage_strategies and self.tools:
            raise ValueError("Advantage strategies are not supported with tool calling (tool_mask).")
        refuse_unavailable_sampling_entropy(self.advantage_strategies, self.rollout_func)
        self.add_callback(LifecycleCallback(self))  # signals, complete-checkpoint markers, non-finite stop
        loss_temperature = getattr(self.weight_strategy, "loss_logps_temperature", None)
        if loss_temperature is not None and loss_temperature != self.temperature:  # e.g. released CW-GRPO: 1.0
            score_logps_at(self, loss_temperature)
        if self.use_vllm and self.vllm_mode == "colocate":
            seed_colocated_vllm(args, self.accelerator.process_index)
        self._paper = trl_paper(args.strategies, self._paper)
        self._telemetry = telemetry_recorder(self) if args.token_telemetry else None  # `sharpgrpo.training.telemetry`

    @property
    def _rollout_inputs(self) -> list[dict[str, Any]] | None:
        """The generation batch's input rows, read by rollout functions (e.g. sharpgrpo.search) for per-row data."""
        return self._generation.inputs

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` (or "true") takes the newest *complete* checkpoint
        and a named one is checked for damaged files first (`sharpgrpo.run.lifecycle`)."""
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        warn_if_off_boundary(resume_from_checkpoint, self.args)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _get_grad_norm(self, model, grad_norm=None):
        self.last_grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)  # checked by LifecycleCallback
        return self.last_grad_norm

    # ------------------------------------------------------------------------------------------------------------
    # Generation: group tags and advantage strategies
    # ------------------------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rank_failures.agree(self.accelerator)  # one all-reduce: a process whose reward raised stops them all
        self._generation.rewards_per_func = rewards_per_func  # gathered over all processes, global row order
        if any(s.needs_correctness for s in self.advantage_strategies):
            columns = {key: [example[key] for example in inputs] for key in inputs[0]
                       if key not in ("prompt", "completion", "completion_ids")}
            self._generation.answer_verdicts = answer_verdicts(
                self.reward_funcs, prompts, completions,
                {**columns, "completion_ids": completion_ids_list, "trainer_state": self.state},
            )
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.use_vllm and self.vllm_mode == "server":  # a seed per request (`sharpgrpo.training.vllm_seeding`)
            self.vllm_generation.generation_kwargs = server_generation_kwargs(self.args, self._generation_count)
        self._generation = GenerationRecord(inputs=inputs)
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        output = tag_groups(output, self.accelerator.process_index, self.accelerator.num_processes, num_generations,
                            self._generation_count)
        self._generation_count += 1
        trl_advantages = output["advantages"]
        if self._generation_strategies():
            output["advantages"] = self._apply_advantage_strategies(output, num_generations, mode)
        if self.advantage_strategies:  # the completion tables show the advantage trained on, TRL's as trl_advantage
            replace_logged_advantages(self._logs, *(self._generation.logged_advantages or (None, None)),
                                      size=len(inputs) * self.accelerator.num_processes)
        if self._telemetry is not None and mode == "train":  # per-token telemetry: the rows' generation-time values
            self._telemetry.remember_prompts(inputs, self.accelerator.process_index)
            output = attach_generation(output, process_index=self.accelerator.process_index,
                                       rewards_per_func=self._generation.rewards_per_func,
                                       trl_advantages=trl_advantages, stages=self._generation.stages)
        return output

    def _trl_computes_old_logps(self) -> bool:
        """TRL 1.16's condition for computing ``old_per_token_logps`` at generation (off-policy or vLLM IS)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every != 0 or (
            self.use_vllm and self.vllm_importance_sampling_correction
        )

    def _folded_strategy(self) -> AdvantageStrategy | None:
        """The advantage strategy applied in the loss instead of at generation (AR, on-policy), or None."""
        return split_folded(self.advantage_strategies, self._trl_computes_old_logps())[1]

    def _generation_strategies(self) -> list[AdvantageStrategy]:
        return split_folded(self.advantage_strategies, self._trl_computes_old_logps())[0]

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation, with the sampling log-probabilities and last hidden states read from transformers'
        ``generate`` when a strategy needs them (`sharpgrpo.training.generation_capture`; no second forward)."""
        strategies = self._generation_strategies()
        logps = any(s.needs_old_logps for s in strategies) and not self._trl_computes_old_logps()
        hidden = any(s.needs_hidden_states for s in strategies)
        entropy = any(s.needs_entropies for s in strategies)
        generate = partial(super()._generate_single_turn, prompt_ids, images, multimodal_fields, num_generations,
                           has_tool_images)
        if not (logps or hidden or entropy) or not self.args.generation_capture or self.use_vllm or (
            self.use_transformers_continuous_batching
        ):
            return generate()
        with GenerationCapture(causal_lm(self.accelerator, self.model), self.temperature, logps=logps, hidden=hidden,
                               entropy=entropy) as capture:
            completion_ids, logprobs = generate()
        self._generation.captured = capture.result(completion_ids)
        return completion_ids, logprobs

    def _policy(self) -> Policy:
        """The policy as the advantage strategies read it (`sharpgrpo.training.policy_inputs`)."""
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        zero3 = self.is_deepspeed_enabled and plugin is not None and plugin.zero_stage == 3
        truncation = sampling_truncation(self.top_p, self.top_k, self.min_p, self.args.generation_kwargs)
        usable = vllm_logps_problem(self.vllm_mode if self.use_vllm else None, truncation) is None
        if not getattr(self, "_old_logps_source_logged", False) and any(
            s.needs_old_logps for s in self._generation_strategies()
        ):  # said once per run, by the main process
            self._old_logps_source_logged = True
            if self.accelerator.is_main_process:
                capture = self.args.generation_capture and not self.use_transformers_continuous_batching
                source = old_logps_source(self.use_vllm, self.vllm_mode, self._trl_computes_old_logps(), truncation,
                                          capture)
                logger.warning(f"[sharpgrpo] old log-probabilities for the advantage strategies: {source}.")
        return Policy(causal_lm(self.accelerator, self.model), zero3, self.temperature,
                      self.args.per_device_train_batch_size, self._sampling_logps, usable)

    def _sampling_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """Log-probabilities of the completion under the current (= sampling) policy; TRL skips them on-policy."""
        input_ids, attention_mask = prompt_completion(output)
        return self._get_per_token_logps_and_entropies(self.model, input_ids, attention_mask,
                                                       output["completion_ids"].size(1),
                                                       batch_size=self.args.per_device_train_batch_size)[0]

    @torch.no_grad()
    def _apply_advantage_strategies(self, output: dict[str, Any], num_generations: int, mode: str) -> torch.Tensor:
        """Run the advantage strategies on whole groups gathered from all processes; return local (B, T)."""
        if "pixel_values" in output:
            raise ValueError("Advantage strategies do not support multimodal inputs.")
        if output["advantages"].dim() != 1:
            raise ValueError("Advantage strategies expect TRL's sequence advantages of shape (B,).")
        record, strategies, policy = self._generation, self._generation_strategies(), self._policy()
        captured, record.captured = record.captured, {}  # this batch's decoding-step values are read once
        local_rows, local_length = output["completion_ids"].shape
        captured = {k: fit_width(v, local_length) for k, v in captured.items() if v.shape[0] == local_rows}
        old_logps, hidden_states, entropies = policy.strategy_inputs(
            output, captured, any(s.needs_hidden_states for s in strategies), any(s.needs_old_logps for s in strategies),
            any(s.needs_entropies for s in strategies))
        needs_correctness = any(s.needs_correctness for s in self.advantage_strategies)
        with policy.unembedding(hidden_states is not None) as unembedding:
            batch = gathered_batch(self.accelerator, output, record, self.reward_weights, old_logps=old_logps,
                                   hidden_states=hidden_states, unembedding=unembedding,
                                   num_generations=num_generations, temperature=self.temperature,
                                   needs_correctness=needs_correctness, entropies=entropies)
            dump = None
            if self.args.dump_token_scores and self.accelerator.is_main_process:  # per-token scores, for inspection
                dump = partial(dump_token_scores, os.path.join(self.args.output_dir, "token_scores"),
                               self._generation_count, self.state.global_step, batch,
                               decode=self.processing_class.decode)
            stages = []
            token_advantages = run_advantage_strategies(strategies, batch, self._strategy_output_checker,
                                                        self._metrics[mode], dump, stages)
        start = self.accelerator.process_index * local_rows
        record.logged_advantages = (sequence_means(token_advantages, batch.completion_mask), batch.advantages[:, 0])
        record.stages = [stage[start : start + local_rows, :local_length] for stage in stages]
        return token_advantages[start : start + local_rows, :local_length].contiguous()

    # ------------------------------------------------------------------------------------------------------------
    # Loss
    # ------------------------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self._sharpness.around_training_loss(self, model, inputs):  # SAM-style probe when due
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _token_weights(self, per_token_logps, mask, advantages, entropies) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight strategy's w (detached unless its ``loss_weights`` lets gradient through; it sees the detached
        per-token entropies) and the output checker's device count of invalid values."""
        weights = strategy_loss_weights(self.weight_strategy, per_token_logps, mask, advantages, entropies)
        return weights, self._strategy_output_checker.count_bad_weights(self.weight_strategy, weights, per_token_logps, mask)

    def _compute_loss(self, model, inputs):
        """TRL 1.16 ``GRPOTrainer._compute_loss`` for every loss type, with token weights (docs/methods.md §1)."""
        args = self.args
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids, attention_mask = prompt_completion(inputs)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        with averaged_head_gradient(causal_lm(self.accelerator, model)):  # FSDP2: TRL's fused head, averaged
            per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
                compute_aux_loss=self.aux_loss_enabled, **{key: inputs.get(key) for key in FORWARD_KEYS},
            )
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        folded = self._folded_strategy()
        if folded is not None:  # e.g. AR-Lopti: p_old = the loss's own detached probabilities (on-policy)
            loss_factor = folded.loss_factor(per_token_logps.detach())
            advantages = loss_factor * advantages
            if self.model.training:  # the completion tables show it (`sharpgrpo.training.telemetry`)
                replace_folded_advantages(self._logs, self.accelerator, inputs, advantages, mask,
                                          self.args.generation_batch_size, self.num_generations)
        old_per_token_logps = inputs.get("old_per_token_logps")
        old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        if self.off_policy_mask_threshold is not None:
            off_policy_mask = self.get_off_policy_mask(
                advantages=advantages, per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_per_token_logps),
                mask=mask, off_policy_threshold=self.off_policy_mask_threshold,
            )
        terms = strategy_metrics = None
        if self.loss_strategies:  # gradient/trust-region masks, extra terms, clip range, sequence objective
            terms, strategy_metrics = collect_loss_terms(self.loss_strategies, LossContext(
                per_token_logps, old_per_token_logps, advantages, mask, entropies.detach(), self.epsilon_low,
                self.epsilon_high, entropy_mask))
        epsilon_low, epsilon_high = clip_range(terms, self.epsilon_low, self.epsilon_high)
        log_ratio = per_token_logps - old_per_token_logps
        coef_1 = torch.exp(
            log_importance_weights(per_token_logps, old_per_token_logps, mask, self.importance_sampling_level)
        )
        weights = bad_weights = None
        if self.weight_strategy is not None:
            weights, bad_weights = self._sharpness.pinned(
                partial(self._token_weights, per_token_logps, mask, advantages, entropies)
            )
        if self.beta != 0.0:
            per_token_kl = kl_penalty(inputs["ref_per_token_logps"], per_token_logps, weights, args.kl_weighting,
                                      coef_1 if args.use_bias_correction_kl else None)
        phi_seq = None
        if self.loss_type == "vespo":  # TRL's gamma weight of the sequence ratio (the parent's own method)
            phi_seq = self.get_gamma_weights(
                advantages=advantages, log_ratio_per_token=log_ratio, mask=mask,
                importance_sampling_ratio=inputs.get("importance_sampling_ratio"), k_pos=args.vespo_k_pos,
                lambda_pos=args.vespo_lambda_pos, k_neg=args.vespo_k_neg, lambda_neg=args.vespo_lambda_neg,
            )
        per_token_loss, surrogate_ratio = weighted_policy_surrogate(
            self.loss_type, coef_1, advantages, per_token_logps, weights, args.weight_placement,
            epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta=args.delta,
            sapo_temperature_pos=args.sapo_temperature_pos, sapo_temperature_neg=args.sapo_temperature_neg,
            phi_seq=phi_seq,
        )
        per_token_loss = apply_token_terms(per_token_loss, terms)
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * off_policy_mask
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type != "vespo":
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]  # VESPO has it inside phi
        if self.beta != 0.0:
            per_token_kl = weighted_kl(per_token_kl, terms)
            per_token_loss = per_token_loss + self.beta * per_token_kl

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        window_tokens = None
        if self.loss_type in WINDOW_NORMALISED_LOSS_TYPES:
            window_tokens = window_token_share(inputs["num_items_in_batch"], self.accelerator.num_processes,
                                               *((accumulation, args.steps_per_generation) if mode == "train" else ()))
        if terms is not None and terms.sequence_loss is not None:  # GMPO: replaces the surrogate and aggregation
            loss, policy_loss = sequence_objective_loss(terms.sequence_loss, per_token_kl if self.beta else None,
                                                        self.beta, mask, accumulation)
        else:
            loss, policy_loss = aggregate_loss(per_token_loss, mask, self.loss_type, accumulation_steps=accumulation,
                                               window_tokens=window_tokens,
                                               max_completion_length=self.max_completion_length)
        values: dict[str, float] = {}  # this micro-batch's metrics, appended together below
        if self._entropy_bonus_enabled:
            effective_mask = mask if entropy_mask is None else mask * entropy_mask
            bonus, values = entropy_bonus(self, entropies, effective_mask, policy_loss, mode)
            loss = loss - bonus
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            values["aux_loss"] = self.accelerator.gather_for_metrics(aux_loss).mean().item()

        if self._telemetry is not None and mode == "train":  # the very tensors above, detached (on telemetry steps)
            vllm_is = self.use_vllm and self.vllm_importance_sampling_correction
            self._telemetry.capture(
                self.state.global_step + 1, inputs,
                loss_type=self.loss_type, accumulation=accumulation, window_tokens=window_tokens, mask=mask,
                old_logp=old_per_token_logps, sampling_logp=inputs.get("sampling_per_token_logps"),
                logp=per_token_logps, ratio=coef_1, surrogate_ratio=surrogate_ratio, entropy=entropies,
                entropy_mask=entropy_mask, weight=weights, advantage=advantages, token_loss=per_token_loss,
                off_policy_mask=off_policy_mask if self.off_policy_mask_threshold is not None else None,
                is_weight=inputs["importance_sampling_ratio"] if vllm_is else None,
                kl=per_token_kl if self.beta != 0.0 else None, **per_token_terms(terms),
            )
        accelerator, clip = self.accelerator, (epsilon_low, epsilon_high)
        values |= loss_metrics(accelerator, self.loss_type, mask, entropies, coef_1, advantages, clip_range=clip,
                               kl=per_token_kl if self.beta else None, phi_seq=phi_seq)
        values |= process_means(accelerator, strategy_metrics)
        if folded is not None:
            values[folded.loss_factor_metric] = global_masked_mean(accelerator, loss_factor, mask)
        bad = 0
        if weights is not None:
            weight_values, bad = weight_metrics(
                accelerator, weights, mask, advantages, bounds=self.weight_strategy.bounds(), clip_range=clip,
                loss_type=self.loss_type, surrogate_ratio=surrogate_ratio, bad_weights=bad_weights,
            )
            values |= weight_values
        append_metrics(self._metrics[mode], values)
        if bad:
            self._strategy_output_checker.raise_for_weights(self.weight_strategy, weights, per_token_logps, mask)
        return loss

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints and the model card
    # ------------------------------------------------------------------------------------------------------------
    def _strategies(self) -> list:
        return ([self.weight_strategy] if self.weight_strategy else []) + self.advantage_strategies + self.loss_strategies

    def strategy_state(self) -> dict[str, dict]:
        return {type(s).__name__: s.state_dict() for s in self._strategies()}

    def _save_rng_state(self, output_dir):
        # Saved with the random states: by every process, and before `hub_strategy` "checkpoint"/"all_checkpoints"
        # starts uploading the checkpoint folder (writing it after `_save_checkpoint` would race that upload).
        super()._save_rng_state(output_dir)
        path = strategy_state_path(output_dir, self.args.world_size, self.args.process_index)
        save_strategy_state(path, self._strategies(), self._generation_count)

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            path = strategy_state_path(checkpoint, self.args.world_size, self.args.process_index)
            generation_count = load_strategy_state(path, self._strategies())
            self._generation_count = self._generation_count if generation_count is None else generation_count

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, base_model: str | None = None):
        """TRL's model card, plus a section naming the strategies, their parameters and papers
        (`sharpgrpo.training.model_card.write_model_card`)."""
        write_model_card(self, super().create_model_card, model_name, dataset_name, tags, base_model)
