"""The temperature the loss's log-probabilities are computed at, where a strategy asks for another than sampling's.

TRL 1.16 scores the policy and the reference with a fused LM head (``trl.trainer.utils.add_fused_lm_head``) that
divides the logits by the sampling temperature T, once, at the trainer's construction: every log-probability of the
loss (its ratio, its KL term, a token-weight strategy's input) and the reference's are of softmax(logits / T).
A token-weight strategy whose ``loss_logps_temperature`` is set (the released CW-GRPO: 1.0, as its authors' code
computes them from raw logits) gets the head re-added at that temperature on the policy and the reference, so that
everything the loss reads is at that temperature while generation still samples at T (generation does not go
through the fused head: transformers' ``generate`` and vLLM apply T themselves).
"""

from __future__ import annotations

from typing import Any


def score_logps_at(trainer: Any, temperature: float) -> None:
    """Re-add TRL's fused LM head at ``temperature`` on ``trainer.model`` (its base model under PEFT, as TRL adds
    it) and on ``trainer.ref_model`` when there is one; the same output fields TRL asked for (log-probabilities and
    entropies for the policy, log-probabilities for the reference). Call at the end of the trainer's ``__init__``."""
    from accelerate.utils import is_peft_model
    from trl.trainer.utils import add_fused_lm_head

    cast = trainer.args.cast_lm_head_to_fp32
    policy = trainer.model.get_base_model() if is_peft_model(trainer.model) else trainer.model
    add_fused_lm_head(policy, temperature=temperature, cast_lm_head_to_fp32=cast, outputs=("log_probs", "entropy"))
    if getattr(trainer, "ref_model", None) is not None:
        add_fused_lm_head(trainer.ref_model, temperature=temperature, cast_lm_head_to_fp32=cast)
    trainer.loss_logps_temperature = temperature
