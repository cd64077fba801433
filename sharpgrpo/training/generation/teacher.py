"""The teacher of the distillation strategies (``opd``, ``iw_opd``; docs/methods.md §16): its per-token
log-probabilities of the sampled completions, the generation input ``teacher_logps``.

``teacher_model`` names it:

* ``ref``: the reference model TRL loaded (``beta`` > 0), or, in a LoRA run, the frozen base with the adapter
  disabled (TRL's own reference there);
* ``base``: the frozen base of a LoRA run (the adapter disabled for the teacher's forward);
* ``ema``: an exponential moving average of the policy's trained weights, theta_T <- decay theta_T + (1 - decay)
  theta after every optimizer step (``teacher_ema_decay``; TRL 1.16's SDPO EMA teacher: ``SyncTeacherModelCallback``,
  trl/experimental/sdpo/teacher_sync.py L54-65, with ``SyncRefModelCallback._sync_target_model``,
  trl/trainer/callbacks.py L130-132, ``teacher_update_rate`` = 1 - decay = 0.05 by default, sdpo_config.py L549-552).
  A copy of the policy (a LoRA run: of the whole PEFT model, only the adapter's weights averaged), updated by a
  ``TrainerCallback`` this module registers; its weights travel in the checkpoint's strategy state (the first
  strategy that uses it carries them) and are restored on resume. Refused under ZeRO-3 / FSDP, where the policy's
  weights are sharded. ``sdpo_teacher: ema`` makes the same average SDPO's self-teacher (one copy when both ask);
* a local path or Hub name: a model loaded once, frozen, on the policy's device and dtype, and prepared as TRL
  prepares its reference model (``GRPOTrainer.__init__``: ``prepare_deepspeed`` under DeepSpeed, which shards it
  under ZeRO-3 as the policy is, ``prepare_fsdp`` under FSDP).

Under ZeRO-3 the teacher's LM head (or, for ``base`` / ``ref``, the policy's or the reference's) is gathered for
the scoring as the policy's is for the strategies that read it (``policy_inputs.full_unembedding``), on every process
together.

A teacher must share the policy's tokenizer (the gap compares log-probabilities of the same token ids): a different
vocabulary is refused naming both; a name that does not load, or a kind the run cannot provide (``base`` without
LoRA, ``ref`` with neither a reference model nor LoRA), is refused in one line while the trainer is built, before the
first step. The teacher scores prompt + completion at the sampling temperature (as TRL's IW-OPD and SDPO trainers
divide the teacher's logits by it), from its last hidden states through its LM head in vocabulary slices
(``capture.logps_from_hidden_states``: no (B, T, V) tensor). ``ref`` reuses the reference log-probabilities TRL
computed for its KL term where it did (``beta`` > 0), so the reference runs one forward per batch, not two
(:func:`reference_logps_first`). Not done: an EMA teacher under ZeRO-3 / FSDP2 (refused), and an EMA of a LoRA adapter
kept as a second adapter (TRL's PEFTAdapterEMACallback: here the copy holds the frozen base too).
"""

from __future__ import annotations

import contextlib
import copy
import os
from functools import partial
from typing import Any

import torch
from transformers import TrainerCallback

from sharpgrpo.training.generation.capture import logps_from_hidden_states
from sharpgrpo.training.generation.inputs import loss_mask, register_generation_input
from sharpgrpo.training.generation.policy_inputs import completion_hidden_states, full_unembedding, zero3_enabled

TEACHER_KINDS = ("ref", "base", "ema")  # besides a path or Hub name


def tokenizer_difference(teacher_tokenizer, policy_tokenizer) -> str | None:
    """Why two tokenizers do not give the same token ids, or None: a different vocabulary (size or any id)."""
    teacher_vocab, policy_vocab = teacher_tokenizer.get_vocab(), policy_tokenizer.get_vocab()
    if len(teacher_vocab) != len(policy_vocab):
        return f"{len(teacher_vocab)} tokens against the policy's {len(policy_vocab)}"
    differing = [token for token, index in policy_vocab.items() if teacher_vocab.get(token) != index]
    if differing:
        return f"{len(differing)} tokens have other ids (e.g. {differing[0]!r})"
    return None


class Teacher:
    """A frozen causal LM scoring completions: ``logps(output)`` -> (B, T) log-probabilities of the completion tokens
    under softmax(logits / temperature), with ``context()`` entered around the forward (e.g. a LoRA adapter
    disabled); ``zero3``: its parameters are partitioned by ZeRO-3 (the head is gathered, on every process)."""

    def __init__(self, lm, temperature: float, rows_per_chunk: int, context=contextlib.nullcontext,
                 zero3: bool = False):
        self.lm, self.temperature, self.rows_per_chunk, self.context = lm, temperature, rows_per_chunk, context
        self.zero3 = zero3

    @torch.no_grad()
    def logps(self, output: dict[str, Any]) -> torch.Tensor:
        with self.context():
            hidden = completion_hidden_states(self.lm, output, self.rows_per_chunk)
            with full_unembedding(self.lm, zero3=self.zero3) as (weight, bias):
                return logps_from_hidden_states(hidden, output["completion_ids"], weight, bias, self.temperature,
                                                self.rows_per_chunk)


class EmaTeacher:
    """An exponential moving average of the policy's trained weights (module docstring, ``ema``).

    ``model``: a frozen copy of the policy made when the trainer is built (theta_T = theta_0), without the forwards
    patched onto the policy's instances (TRL's fused LM head, ``trl.trainer.utils.add_fused_lm_head``, replaces
    ``model.forward`` by a closure over the policy's own bound forward: a deep copy keeps that closure, so the copy's
    ``model(...)`` would compute with the policy's weights); ``update()`` sets
    theta_T <- decay * theta_T + (1 - decay) * theta for every parameter the policy trains (``requires_grad``), in
    the policy's dtype, as TRL's ``_sync_target_model`` does (``target.mul_(1 - alpha).add_(theta, alpha=alpha)``,
    alpha = 1 - decay). ``state_dict()`` / ``load_state_dict()``: the averaged weights, by parameter name, for the
    checkpoint's strategy state."""

    PREFIX = "teacher_ema."

    def __init__(self, policy, decay: float):
        self.policy, self.decay = policy, float(decay)
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        copied = {id(module) for module in self.model.modules()}
        for module in self.model.modules():  # a forward patched onto the policy's instance would run the policy
            if _closes_over_another_module(vars(module).get("forward"), copied):
                del module.forward  # back to the class's forward, on the copy's own weights
        averaged = dict(self.model.named_parameters())
        self.pairs = [(name, averaged[name], parameter) for name, parameter in policy.named_parameters()
                      if parameter.requires_grad]

    @torch.no_grad()
    def update(self) -> None:
        for _, averaged, parameter in self.pairs:
            averaged.mul_(self.decay).add_(parameter.detach(), alpha=1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {self.PREFIX + name: averaged.detach().cpu().clone() for name, averaged, _ in self.pairs}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        expected = {self.PREFIX + name for name, _, _ in self.pairs}
        if set(state) != expected:
            missing = sorted(expected - set(state))
            raise ValueError(
                "teacher_model='ema': the checkpoint's strategy state does not hold this policy's EMA teacher "
                f"weights ({len(missing)} of {len(expected)} missing, e.g. {missing[:1] or sorted(state)[:1]}); "
                "it was saved by a run with another teacher_model or another model."
            )
        for name, averaged, _ in self.pairs:
            averaged.copy_(state[self.PREFIX + name].to(averaged.device, averaged.dtype))


def _closes_over_another_module(function, modules: set[int]) -> bool:
    """``function`` (an instance's patched ``forward``, or None) holds in its closure a module, or a method of a
    module, whose id is not in ``modules``."""
    cells = getattr(getattr(function, "__func__", function), "__closure__", None) or ()
    for cell in cells:
        target = getattr(cell.cell_contents, "__self__", cell.cell_contents)
        if isinstance(target, torch.nn.Module) and id(target) not in modules:
            return True
    return False


class EmaTeacherCallback(TrainerCallback):
    """Updates the EMA teacher after every optimizer step (``on_step_end``: after the step, before a checkpoint is
    saved, so the checkpoint holds the average of the weights it holds)."""

    def __init__(self, ema: EmaTeacher):
        self.ema = ema

    def on_step_end(self, args, state, control, **kwargs):
        self.ema.update()
        return control


def ema_teacher(trainer) -> EmaTeacher:
    """The EMA teacher of ``trainer``'s policy, made once per trainer and shared by every strategy that uses it
    (``teacher_model: ema``, ``sdpo_teacher: ema``): its callback registered and its weights handed to the checkpoint's
    strategy state of the first advantage strategy that uses it (``keep_teacher_state``)."""
    if getattr(trainer, "_ema_teacher", None) is not None:
        return trainer._ema_teacher
    if zero3_enabled(trainer.accelerator) or getattr(trainer, "is_fsdp_enabled", False):
        raise ValueError("An EMA teacher (teacher_model: ema, sdpo_teacher: ema) is not supported under ZeRO-3 / FSDP "
                         "(the policy's weights are sharded, a copy of them would be empty shards); name a teacher's "
                         "path, `ref` or `base` (opd, iw_opd), or use sdpo_teacher: live.")
    ema = EmaTeacher(trainer.accelerator.unwrap_model(trainer.model), trainer.args.teacher_ema_decay)
    trainer.add_callback(EmaTeacherCallback(ema))
    holder = next((s for s in trainer.strategies.advantage
                   if hasattr(s, "uses_ema_teacher") and s.uses_ema_teacher()), None)
    if holder is not None:
        holder.keep_teacher_state(ema)
    trainer._ema_teacher = ema
    return ema


def _bare(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def load_teacher(name: str, trainer) -> Teacher:
    """The teacher ``name`` names for ``trainer`` (module docstring); refuses in one line what cannot be one."""
    from accelerate.utils import is_peft_model

    policy = trainer.accelerator.unwrap_model(trainer.model)
    scorer = partial(Teacher, temperature=trainer.temperature, rows_per_chunk=trainer.args.per_device_train_batch_size,
                     zero3=zero3_enabled(trainer.accelerator))
    lora = is_peft_model(policy)
    if name == "base" or (name == "ref" and getattr(trainer, "ref_model", None) is None):
        if not lora:
            need = "a LoRA run (peft_config)" if name == "base" else "beta > 0 (TRL loads a reference model only then)"
            raise ValueError(f"teacher_model={name!r} needs {need}; name the teacher's path or Hub name instead.")
        return scorer(_bare(policy), context=policy.disable_adapter)
    if name == "ref":
        return scorer(_bare(trainer.accelerator.unwrap_model(trainer.ref_model)))
    if name == "ema":
        return scorer(_bare(ema_teacher(trainer).model))
    shards = trainer.accelerator.num_processes if zero3_enabled(trainer.accelerator) else 1
    teacher = prepared_like_reference(load_named_teacher(name, policy, trainer.processing_class, shards), trainer)
    return scorer(_bare(trainer.accelerator.unwrap_model(teacher)))


def prepared_like_reference(model, trainer):
    """``model`` prepared as TRL 1.16 prepares its reference model (``GRPOTrainer.__init__``, grpo_trainer.py
    L1182-1187): a DeepSpeed inference engine under DeepSpeed (sharded under ZeRO-3), FSDP-wrapped under FSDP,
    otherwise accelerate's evaluation-mode preparation. The engine is kept on the trainer (``_teacher_engine``)."""
    from trl.models import prepare_deepspeed, prepare_fsdp

    if trainer.is_deepspeed_enabled:
        prepared = prepare_deepspeed(model, trainer.accelerator)
    elif trainer.is_fsdp_enabled:
        prepared = prepare_fsdp(model, trainer.accelerator)
    else:
        prepared = trainer.accelerator.prepare_model(model, evaluation_mode=True)
    trainer._teacher_engine = prepared
    return prepared


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_named_teacher(name: str, policy, policy_tokenizer, shards: int = 1):
    """A teacher model from a path or Hub name (a LoRA adapter folder: merged into the base it names, a prepared name
    included), frozen, on the policy's device and dtype; its tokenizer checked, and
    its size against the free memory (:func:`check_teacher_fits`; ``shards``: processes ZeRO-3 partitions it over)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharpgrpo.models.source import adapter_base_model

    tokenizer = getattr(policy_tokenizer, "tokenizer", policy_tokenizer)  # a processor's tokenizer
    base = adapter_base_model(name) if os.path.isdir(name) else None  # a LoRA adapter: loaded through its base
    own_tokenizer = base is None or any(os.path.isfile(os.path.join(name, f)) for f in TOKENIZER_FILES)
    try:
        teacher_tokenizer = AutoTokenizer.from_pretrained(name if own_tokenizer else base)
    except (OSError, ValueError) as error:
        reason = _first_line(error)
        raise ValueError(f"teacher_model={name!r}: no model or tokenizer loads from there ({reason}).") from None
    difference = tokenizer_difference(teacher_tokenizer, tokenizer)
    if difference is not None:
        raise ValueError(
            f"teacher_model={name!r} has another tokenizer than the policy {policy.config._name_or_path!r}: "
            f"{difference}; distillation compares log-probabilities of the same token ids, so the teacher must share "
            "the policy's tokenizer."
        )
    first_parameter = next(policy.parameters())
    check_teacher_fits(base or name, first_parameter.dtype, first_parameter.device, shards)
    try:
        teacher = AutoModelForCausalLM.from_pretrained(base or name, dtype=first_parameter.dtype)
        if base is not None:  # the adapter merged into its base: one frozen model, as a full teacher is
            from peft import PeftModel

            teacher = PeftModel.from_pretrained(teacher, name).merge_and_unload()
        teacher.to(first_parameter.device)
    except (OSError, ValueError) as error:
        raise ValueError(f"teacher_model={name!r}: the model does not load ({_first_line(error)}).") from None
    except (torch.OutOfMemoryError, MemoryError) as error:  # check_teacher_fits's estimate was not enough
        reason = _first_line(error)
        raise ValueError(f"teacher_model={name!r} does not fit on {first_parameter.device} ({reason}).") from None
    return teacher.eval().requires_grad_(False)


def _first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def check_teacher_fits(name: str, dtype: torch.dtype, device: torch.device, shards: int = 1) -> None:
    """Refuse, before loading, a teacher whose weights alone need more than the free memory of ``device`` (CUDA: the
    free device memory; CPU: the available RAM): its parameter count from its config on the meta device, times the
    policy's dtype size, divided by ``shards`` (the processes ZeRO-3 partitions it over)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(name)
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (OSError, ValueError, KeyError):
        return  # no config (from_pretrained says why, in one line) or remote code: loading is the check
    with torch.device("meta"):  # the class itself, not from_config: under ZeRO-3 that would enter zero.Init
        skeleton = model_class(config)
    needed = sum(p.numel() for p in skeleton.parameters()) * torch.finfo(dtype).bits // 8 / max(shards, 1)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    elif device.type == "cpu":
        import psutil

        free = psutil.virtual_memory().available
    else:
        return
    if needed > free:
        spread = f" over {shards} processes" if shards > 1 else ""
        raise ValueError(
            f"teacher_model={name!r} does not fit: its weights alone need {needed / 2**30:.1f} GiB in {dtype}"
            f"{spread} on {device}, where {free / 2**30:.1f} GiB is free. Name a smaller teacher, `ref` / `base`, or "
            "shard it with DeepSpeed ZeRO-3 (the teacher is partitioned as the policy is)."
        )


@register_generation_input("teacher_logps")
def teacher_logps(trainer):
    """Generation input ``teacher_logps``: (B_local, T) teacher log-probabilities of the sampled completion tokens
    (the teacher loaded once, here, when the trainer is built)."""
    name = trainer.args.teacher_model
    if not name:
        raise ValueError("teacher_model is not set: the distillation strategies need a teacher (`ref`, `base`, `ema` "
                         "or a model's path or Hub name).")
    teacher = load_teacher(name, trainer)
    return reference_logps_first(teacher.logps) if name == "ref" else teacher.logps


def reference_logps_first(score):
    """``score`` (a scorer of the reference policy) replaced, on every batch where TRL already computed its
    reference's log-probabilities (``beta`` > 0: ``output["ref_per_token_logps"]``, the same reference at the same
    sampling temperature, ``GRPOTrainer._generate_and_score_completions``), by those: one reference forward per batch,
    not two."""

    def provide(output: dict[str, Any]) -> torch.Tensor:
        computed = output.get("ref_per_token_logps")
        return computed if computed is not None else score(output)

    return provide


# SDPO's self-teacher (docs/methods.md §16.3): TRL 1.16's templates (trl/experimental/sdpo/sdpo_config.py defaults).
REPROMPT_TEMPLATE = "{prompt}{solution}{feedback}\n\nCorrectly solve the original question.\n"
SOLUTION_TEMPLATE = "\nCorrect solution:\n\n{successful_previous_attempt}\n\n"
FEEDBACK_TEMPLATE = "\nThe following is feedback from your unsuccessful earlier attempt:\n\n{feedback_raw}\n\n"
FEEDBACK_COLUMN = "privileged_context"  # the dataset column TRL's SDPO reads feedback from


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    last = messages[-1]
    if last.get("role") != "user":
        raise ValueError("sdpo: a conversational prompt must end with a user turn (the self-teacher's reprompt "
                         f"replaces it); this one ends with role {last.get('role')!r}.")
    content = last.get("content", "")
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if part.get("type") == "text")
    return content


def self_teacher_prompts(prompts: list, demonstrations: list[str | None], feedbacks: list[str | None]) -> list:
    """The self-teacher's prompt of each row: the row's prompt reprompted with its demonstration and feedback (TRL
    1.16 ``SuccessfulRolloutTeacherContextBuilder.build`` L265-292), or the prompt itself where it has neither.
    A conversational prompt keeps its earlier messages and gets the reprompt as its last user turn."""
    out = []
    for prompt, demonstration, feedback in zip(prompts, demonstrations, feedbacks, strict=True):
        if demonstration is None and feedback is None:
            out.append(prompt)
            continue
        solution = "" if demonstration is None else SOLUTION_TEMPLATE.format(successful_previous_attempt=demonstration)
        feedback_text = "" if feedback is None else FEEDBACK_TEMPLATE.format(feedback_raw=feedback)
        if isinstance(prompt, list):
            text = REPROMPT_TEMPLATE.format(prompt=_last_user_text(prompt), solution=solution, feedback=feedback_text)
            out.append(prompt[:-1] + [{"role": "user", "content": text}])
        else:
            out.append(REPROMPT_TEMPLATE.format(prompt=prompt, solution=solution, feedback=feedback_text))
    return out


def successful_siblings(rewards: torch.Tensor, num_generations: int, threshold: float, exclude_self: bool
                        ) -> list[int | None]:
    """For each row of the global batch, the first other completion of its group whose reward reaches ``threshold``
    (the row itself too unless ``exclude_self``), or None (TRL 1.16 ``build`` L222-245)."""
    found: list[int | None] = []
    values = rewards.tolist()
    for i in range(len(values)):
        start = (i // num_generations) * num_generations
        found.append(next((j for j in range(start, start + num_generations)
                           if not (exclude_self and j == i) and values[j] >= threshold), None))
    return found


@register_generation_input("self_teacher_logps")
def self_teacher_logps(trainer):
    """Generation input ``self_teacher_logps`` (SDPO): the policy's own log-probabilities (``sdpo_teacher: live``), or
    its EMA's (``ema``), of each sampled completion conditioned on a reprompt holding a successful sibling's completion
    (and the row's ``privileged_context`` feedback with ``sdpo_feedback``); NaN on the rows that have neither (no
    self-teacher)."""
    from accelerate.utils import gather_object

    from sharpgrpo.training.generation.advantage_pipeline import gather_rows, total_rewards
    from sharpgrpo.training.generation.policy_inputs import causal_lm

    args, accelerator = trainer.args, trainer.accelerator
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    ema = ema_teacher(trainer) if args.sdpo_teacher == "ema" else None  # made (or refused) when the trainer is built

    def tokenize(prompts: list) -> list[list[int]]:
        if isinstance(prompts[0], list):
            return trainer.processing_class.apply_chat_template(
                conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True,
                **trainer.chat_template_kwargs)["input_ids"]
        return trainer.processing_class(text=prompts)["input_ids"]

    def provide(output: dict[str, Any]) -> torch.Tensor:
        record = trainer._generation
        local = output["completion_ids"].size(0)
        rewards = total_rewards(record.rewards_per_func, trainer.reward_weights)
        completions = gather_rows(accelerator, output["completion_ids"])
        inputs = record.inputs or [{} for _ in range(local)]
        prompts = gather_object([row["prompt"] for row in inputs])
        feedbacks = gather_object([row.get(FEEDBACK_COLUMN) if args.sdpo_feedback else None for row in inputs])
        siblings = successful_siblings(rewards, trainer.num_generations, args.sdpo_success_threshold,
                                       exclude_self=True)
        first = accelerator.process_index * local
        rows = range(first, first + local)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        demonstrations = [None if siblings[i] is None else tokenizer.decode(  # as TRL: the non-pad ids, decoded
            completions[siblings[i]][completions[siblings[i]] != pad], skip_special_tokens=True) for i in rows]
        feedback = [f if isinstance(f, str) and f.strip() else None for f in (feedbacks[i] for i in rows)]
        teacher_prompts = self_teacher_prompts([prompts[i] for i in rows], demonstrations, feedback)
        ids = [torch.as_tensor(p[-args.sdpo_max_reprompt_length:]) for p in tokenize(teacher_prompts)]
        width = max(len(p) for p in ids)
        device = output["completion_ids"].device
        prompt_ids = torch.stack([torch.cat([torch.full((width - len(p),), pad), p]) for p in ids]).to(device)
        prompt_mask = torch.stack([torch.cat([torch.zeros(width - len(p)), torch.ones(len(p))]) for p in ids])
        teacher_output = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask.long().to(device),
                          "completion_ids": output["completion_ids"], "completion_mask": output["completion_mask"]}
        lm = causal_lm(accelerator, trainer.model) if ema is None else _bare(ema.model)
        teacher = Teacher(lm, trainer.temperature, args.per_device_train_batch_size, zero3=zero3_enabled(accelerator))
        logps = teacher.logps(teacher_output)
        has_teacher = torch.tensor([d is not None or f is not None for d, f in zip(demonstrations, feedback)],
                                   device=logps.device)
        return torch.where(has_teacher[:, None], logps, torch.nan)

    return provide


@register_generation_input("rlsd_thought_span")
def rlsd_thought_span(trainer):
    """Generation input ``rlsd_thought_span`` (``rlsd_thought_only``): 1 on the loss tokens between the opening and
    closing tags of ``rlsd_thought_tags``, each tag encoded alone without special tokens and matched token for token in
    the completion, as RLSD's ``_build_thought_span_mask`` does (``strategies.distillation.tag_span_mask``)."""
    from sharpgrpo.strategies.distillation import tag_span_mask

    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    opening, closing = (tokenizer.encode(tag, add_special_tokens=False)
                        for tag in str(trainer.args.rlsd_thought_tags).split())

    def provide(output: dict[str, Any]) -> torch.Tensor:
        mask = loss_mask(output).float()
        return tag_span_mask(output["completion_ids"].cpu(), mask.cpu(), opening, closing).to(mask.device)

    return provide
