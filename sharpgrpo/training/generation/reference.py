"""The reference policy's log-probabilities of the sampled completions, the generation input ``reference_logps``
(``kl_in_reward``; docs/methods.md §15.7).

The reference is TRL's own where it loaded one (``beta`` > 0); else, in a LoRA run, the frozen base (the adapter
disabled, TRL's reference there); else the initial checkpoint (``model_name_or_path``) loaded again, frozen, on the
policy's device and dtype: the policy before training, which is what TRL's reference model is. Scored at the sampling
temperature, as TRL scores its reference, through the teachers' scorer (``teacher.Teacher``: hidden states, then the
LM head in vocabulary slices).
"""

from __future__ import annotations

from sharpgrpo.training.generation.inputs import register_generation_input
from sharpgrpo.training.generation.teacher import load_teacher, reference_logps_first


def reference_scorer(trainer):
    """The scorer of the reference policy for ``trainer`` (module docstring)."""
    from accelerate.utils import is_peft_model

    policy = trainer.accelerator.unwrap_model(trainer.model)
    if getattr(trainer, "ref_model", None) is not None or is_peft_model(policy):
        return load_teacher("ref", trainer)  # TRL's reference model, or a LoRA run's frozen base
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise ValueError("kl_in_reward with beta=0 under DeepSpeed ZeRO or FSDP: set beta > 0 so that TRL loads (and "
                         "shards) the reference model, or train with LoRA.")
    initial = policy.config._name_or_path
    try:
        return load_teacher(initial, trainer)
    except ValueError as error:
        raise ValueError(f"kl_in_reward: the reference is the initial checkpoint {initial!r} loaded again, which "
                         f"failed ({error}); set beta > 0 so that TRL loads the reference model.") from None


@register_generation_input("reference_logps")
def reference_logps(trainer):
    """The reference policy's log-probabilities of this process's completion tokens (B_local, T_local); those TRL
    computed for its KL term where it did (``beta`` > 0), with no second forward."""
    return reference_logps_first(reference_scorer(trainer).logps)
