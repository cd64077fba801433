"""``SharpGRPOTrainer``: TRL's ``GRPOTrainer`` with pluggable token-level strategies (tested with trl==1.16.0).

Glue only: the configured strategies are one object (``StrategySet``, `sharpgrpo.training.strategy_set`); what each
hook calls lives in `sharpgrpo.training`, grouped by hook (``generation/``, ``loss/``, ``telemetry/``). Overridden:

* ``_generate_and_score_completions`` (TRL): after TRL has generated, scored and normalised a generation batch, tag
  every row with its group id and index in the group (so group structure survives TRL's shuffling and splitting)
  and run the advantage strategies once, on whole groups gathered from every process, replacing ``advantages`` (B,)
  by token advantages (B, T). The inner hooks ``_calculate_rewards`` and ``_generate_single_turn`` (TRL) record the
  rewards, the answer checks' verdicts and the values read from the decoding steps in one ``GenerationRecord``. A
  generation-level feature (e.g. dynamic sampling) wraps the ``super()`` call there.
* ``_compute_loss`` (TRL): the forward (MoE routes replayed, `training.generation.routing_replay`), TRL's masks, then
  ``policy_loss`` (`training.loss.policy_loss`; docs/methods.md §1): TRL's loss for every loss type with strategies
  folded in, the parent's with ``equal`` (tests/integration/test_parity.py); the sharpness probe runs first when due.
* ``train``, ``_get_grad_norm``, ``_save_rng_state``, ``_load_rng_state`` (transformers) and ``create_model_card``
  (TRL): resume checks, the non-finite-gradient stop, strategy state in checkpoints, the strategies on the card.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, ClassVar

from transformers.utils import logging
from trl import GRPOTrainer

from sharpgrpo.config import SharpGRPOConfig
from sharpgrpo.models.prepared import resolve_model_name
from sharpgrpo.models.source import record_base_model
from sharpgrpo.run.lifecycle import LifecycleCallback, resolve_resume_checkpoint, warn_if_off_boundary
from sharpgrpo.training.generation.advantage_pipeline import GenerationRecord, advantage_pipeline, row_verdicts
from sharpgrpo.training.generation.advantage_pipeline import tag_groups
from sharpgrpo.training.generation.async_rollout.rollout_func import async_rollout_kwargs
from sharpgrpo.training.generation.capture import GenerationCapture
from sharpgrpo.training.generation.dynamic_sampling import dynamic_sampler, generate_batch, needs_verdicts
from sharpgrpo.training.generation.entropy_inputs import refuse_unsupported_rollouts
from sharpgrpo.training.generation.inputs import environment_inputs, input_providers, loss_mask
from sharpgrpo.training.generation.policy_inputs import Policy, causal_lm, old_logps_source, prompt_completion
from sharpgrpo.training.generation.policy_inputs import sampling_truncation, vllm_logps_problem, zero3_enabled
from sharpgrpo.training.generation.rank_agreement import RankFailures
from sharpgrpo.training.generation.routing_replay import replayed_routes
from sharpgrpo.training.generation.score_dump import dump_token_scores
from sharpgrpo.training.generation.vllm_checks import check_vllm_request
from sharpgrpo.training.generation.vllm_sync import prepare_colocated_engine
from sharpgrpo.training.generation.vllm_seeding import server_generation_kwargs
from sharpgrpo.training.launch_check import check_launch, check_launch_request
from sharpgrpo.training.loss.entropy_bonus import entropy_coef_to_apply, update_entropy_control
from sharpgrpo.training.loss.logps_temperature import score_logps_at
from sharpgrpo.training.loss.metrics import append_metrics
from sharpgrpo.training.loss.policy_loss import LossBatch, LossSettings, PolicyLossResult, policy_loss
from sharpgrpo.training.loss.sharded_head import averaged_head_gradient
from sharpgrpo.training.loss.sharpness import SharpnessProbe
from sharpgrpo.training.model_card import trl_paper, write_model_card
from sharpgrpo.training.output_checks import checked_reward_functions
from sharpgrpo.training.strategy_set import GenerationNeeds, StrategySet
from sharpgrpo.training.strategy_state import load_strategy_state, save_strategy_state, strategy_state_path
from sharpgrpo.training.telemetry.recorder import attach_generation, replace_folded_advantages
from sharpgrpo.training.telemetry.recorder import replace_logged_advantages, telemetry_recorder

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
        self.strategies = StrategySet(args)  # by kind; their needs, fold, checks and checkpoint state
        self._generation = GenerationRecord()  # filled by the generation hooks, read by the advantage strategies
        self._generation_count = 0
        self._sharpness = SharpnessProbe(args.sharpness_probe_steps, args.sharpness_rho)
        check_vllm_request(args)  # vLLM missing, outside TRL's range, or a request it cannot serve: one line
        prepared_name = None
        if isinstance(model, str) and resolve_model_name(model) != model:  # a prepared model (sharpgrpo-tiny)
            prepared_name, model = model, resolve_model_name(model)  # -> its folder, built on first use
        # FSDP asked for on the CPU (or FSDP1 with THR): refused before accelerate builds something else
        check_launch_request(args, head_readers=StrategySet.head_readers(self.strategies.classes))
        self._rank_failures = RankFailures()  # a reward error on one process: all stop together (rank_agreement)
        kwargs = async_rollout_kwargs(args, kwargs)  # async_generation: TRL's rollout_func, a rollout process
        super().__init__(model, self._rank_failures.wrap(checked_reward_functions(reward_funcs, args)), args, **kwargs)
        self._rank_failures.active = self.accelerator.num_processes > 1
        check_launch(self.accelerator, args)  # FSDP/DeepSpeed/processes as the launcher asked, in one line
        if prepared_name is not None:  # the card and a saved adapter name the model as given, not a cache folder
            self.base_model_name = self.base_model_name or prepared_name
            record_base_model(self.model, prepared_name)
        refuse_unsupported_rollouts(self.advantage_strategies, self.environment_factories, self.tools,
                                    self.rollout_func)
        self.add_callback(LifecycleCallback(self))  # signals, complete-checkpoint markers, non-finite stop
        loss_temperature = self.strategies.loss_logps_temperature()
        if loss_temperature is not None and loss_temperature != self.temperature:  # e.g. released CW-GRPO: 1.0
            score_logps_at(self, loss_temperature)
        if self.use_vllm and self.vllm_mode == "colocate":
            prepare_colocated_engine(self)  # seed, sync, kept sets (training.generation.vllm_sync)
        self._paper = trl_paper(args.strategies, self._paper)
        self._input_providers = input_providers(self, self._needs().inputs)  # sharpgrpo.training.generation.inputs
        self._dynamic_sampler = dynamic_sampler(self)  # its filter checked against the run's reward functions
        folded = self._folded_strategy() is not None
        self._telemetry = telemetry_recorder(self, self.strategies, folded) if args.token_telemetry else None

    # The configured strategies of each kind, read from (and replaceable in) the strategy set.
    weight_strategy = property(lambda self: self.strategies.weight,
                               lambda self, strategy: setattr(self.strategies, "weight", strategy))
    advantage_strategies = property(lambda self: self.strategies.advantage,
                                    lambda self, strategies: setattr(self.strategies, "advantage", list(strategies)))

    @property
    def _rollout_inputs(self) -> list[dict[str, Any]] | None:
        """The generation batch's input rows, read by rollout functions (e.g. sharpgrpo.search) for per-row data."""
        return self._generation.inputs

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` (or "true") takes the newest *complete* checkpoint
        and a named one is checked for damaged files first (`sharpgrpo.run.lifecycle`)."""
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir, self.args)
        warn_if_off_boundary(resume_from_checkpoint, self.args)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _get_grad_norm(self, model, grad_norm=None):
        self.last_grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)  # checked by LifecycleCallback
        return self.last_grad_norm

    # ------------------------------------------------------------------------------------------------------------
    # Generation: group tags and advantage strategies
    # ------------------------------------------------------------------------------------------------------------
    def _trl_computes_old_logps(self) -> bool:
        """TRL 1.16's condition for computing ``old_per_token_logps`` at generation (off-policy or vLLM IS)."""
        off_policy = self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations)
        return off_policy != 0 or (self.use_vllm and self.vllm_importance_sampling_correction)

    def _folded_strategy(self):
        """The advantage strategy applied in the loss instead of at generation (AR, on-policy), or None."""
        return self.strategies.split(self._trl_computes_old_logps())[1]

    def _generation_strategies(self) -> list:
        return self.strategies.split(self._trl_computes_old_logps())[0]

    def _needs(self) -> GenerationNeeds:  # what the advantage strategies run at generation need
        return self.strategies.needs(self._trl_computes_old_logps())

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rank_failures.agree(self.accelerator)  # one all-reduce: a process whose reward raised stops them all
        self._generation.rewards_per_func = rewards_per_func  # gathered over all processes, global row order
        if self._needs().correctness or needs_verdicts(self.args):  # answer checks (`strategies.correctness`)
            self._generation.answer_verdicts = row_verdicts(self.reward_funcs, inputs, prompts, completions,
                                                            completion_ids_list, self.state)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.use_vllm and self.vllm_mode == "server":  # a seed per request (`training.generation.vllm_seeding`)
            self.vllm_generation.generation_kwargs = server_generation_kwargs(self.args, self._generation_count)
        mode = "train" if self.model.training else "eval"  # TRL's generation, refilled by dynamic sampling:
        inputs, output, self._generation = generate_batch(self, inputs, super()._generate_and_score_completions, mode)
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

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation, with the sampling log-probabilities and last hidden states read from transformers'
        ``generate`` when a strategy needs them (`sharpgrpo.training.generation.capture`; no second forward)."""
        needs = self._needs()
        logps = needs.old_logps and not self._trl_computes_old_logps()
        generate = partial(super()._generate_single_turn, prompt_ids, images, multimodal_fields, num_generations,
                           has_tool_images)
        backend = self.use_vllm or self.use_transformers_continuous_batching  # no decoding steps of ours to read
        if not (logps or needs.hidden_states or needs.entropies) or not self.args.generation_capture or backend:
            return generate()
        with GenerationCapture(causal_lm(self.accelerator, self.model), self.temperature, logps=logps,
                               hidden=needs.hidden_states, entropy=needs.entropies) as capture:
            completion_ids, logprobs = generate()
        self._generation.captured = capture.result(completion_ids)
        return completion_ids, logprobs

    def _policy(self) -> Policy:
        """The policy as the advantage strategies read it (`sharpgrpo.training.generation.policy_inputs`)."""
        truncation = sampling_truncation(self.top_p, self.top_k, self.min_p, self.args.generation_kwargs)
        usable = vllm_logps_problem(self.vllm_mode if self.use_vllm else None, truncation) is None
        if not getattr(self, "_old_logps_source_logged", False) and self._needs().old_logps:  # said once, by rank 0
            self._old_logps_source_logged = True
            if self.accelerator.is_main_process:
                capture = self.args.generation_capture and not self.use_transformers_continuous_batching
                source = old_logps_source(self.use_vllm, self.vllm_mode, self._trl_computes_old_logps(), truncation,
                                          capture)
                logger.warning(f"[sharpgrpo] old log-probabilities for the advantage strategies: {source}.")
        return Policy(causal_lm(self.accelerator, self.model), zero3_enabled(self.accelerator), self.temperature,
                      self.args.per_device_train_batch_size, self._sampling_logps, usable)

    def _sampling_logps(self, output: dict[str, Any]):
        """Log-probabilities of the completion under the current (= sampling) policy; TRL skips them on-policy."""
        length, rows = output["completion_ids"].size(1), self.args.per_device_train_batch_size
        return self._get_per_token_logps_and_entropies(self.model, *prompt_completion(output), length, rows)[0]

    def _apply_advantage_strategies(self, output: dict[str, Any], num_generations: int, mode: str):
        """The advantage pipeline on whole groups gathered from all processes; returns this process's (B, T)."""
        dump = None
        if self.args.dump_token_scores and self.accelerator.is_main_process:  # per-token scores, for inspection
            dump = partial(dump_token_scores, os.path.join(self.args.output_dir, "token_scores"),
                           self._generation_count, self.state.global_step, decode=self.processing_class.decode)
        result = advantage_pipeline(self.accelerator, output, self._generation, self._generation_strategies(),
                                    self._needs(), self._policy(), self.strategies.checker, self.reward_weights,
                                    num_generations, self.temperature, self._input_providers, dump)
        for name, value in result.metrics:
            self._metrics[mode][name].append(value)
        self._generation.logged_advantages, self._generation.stages = result.logged_advantages, result.stages
        return result.advantages

    # ------------------------------------------------------------------------------------------------------------
    # Loss
    # ------------------------------------------------------------------------------------------------------------
    def _policy_loss(self, model, inputs, weights=None) -> PolicyLossResult:
        """The forward and TRL's masks, then the policy loss of this micro-batch (a pure function of them)."""
        mask = loss_mask(inputs)
        with averaged_head_gradient(causal_lm(self.accelerator, model)), replayed_routes(self, inputs):
            logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
                model, *prompt_completion(inputs), inputs["completion_ids"].size(1), compute_entropy=True,
                compute_aux_loss=self.aux_loss_enabled, **{key: inputs.get(key) for key in FORWARD_KEYS},
            )
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        training = self.model.training
        batch = LossBatch(
            logps, entropies, mask, inputs["advantages"], old_logps=inputs.get("old_per_token_logps"),
            sampling_logps=inputs.get("sampling_per_token_logps"), ref_logps=inputs.get("ref_per_token_logps"),
            importance_sampling_ratio=inputs.get("importance_sampling_ratio"), entropy_mask=entropy_mask,
            aux_loss=aux_loss if self.aux_loss_enabled else None, num_items_in_batch=inputs.get("num_items_in_batch"),
            accumulation_steps=self.current_gradient_accumulation_steps if training else 1.0, training=training,
            **environment_inputs(inputs))
        return policy_loss(batch, self.strategies, LossSettings.from_trainer(self), self.accelerator,
                           folded=self._folded_strategy(), weights=weights, entropy_coef=entropy_coef_to_apply(self))

    def _compute_loss(self, model, inputs):
        """TRL 1.16 ``GRPOTrainer._compute_loss`` for every loss type, with the strategies (docs/methods.md §1)."""
        weights = self._sharpness.pinned_weights(self, model, partial(self._policy_loss, model, inputs))  # SAM probe
        result = self._policy_loss(model, inputs, weights)
        training = self.model.training
        append_metrics(self._metrics["train" if training else "eval"],
                       result.metrics | update_entropy_control(self, result.entropy_stats, training))
        if training and self._folded_strategy() is not None:  # the completion tables show the folded advantage
            replace_folded_advantages(self._logs, self.accelerator, inputs, result.tensors.advantage,
                                      result.tensors.mask, self.args.generation_batch_size, self.num_generations)
        if self._telemetry is not None and training:  # the loss's tensors, detached (on telemetry steps)
            self._telemetry.capture(self.state.global_step + 1, inputs, result)
        return result.loss

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints and the model card
    # ------------------------------------------------------------------------------------------------------------
    def strategy_state(self) -> dict[str, dict]:
        return self.strategies.state_dict()

    def _save_rng_state(self, output_dir):
        # Saved with the random states: by every process, and before `hub_strategy` "checkpoint"/"all_checkpoints"
        # starts uploading the checkpoint folder (writing it after `_save_checkpoint` would race that upload).
        super()._save_rng_state(output_dir)
        path = strategy_state_path(output_dir, self.args.world_size, self.args.process_index)
        save_strategy_state(path, self.strategies, self._generation_count)

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            path = strategy_state_path(checkpoint, self.args.world_size, self.args.process_index)
            generation_count = load_strategy_state(path, self.strategies)
            self._generation_count = self._generation_count if generation_count is None else generation_count

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, base_model: str | None = None):
        """TRL's model card, plus the strategies, their parameters and papers (`training.model_card`)."""
        write_model_card(self, super().create_model_card, model_name, dataset_name, tags, base_model)
