"""``opd`` on the real model, in the offline set-up that needs no second download: the smol base (the frozen base of
a LoRA run, ``teacher_model: base``) teaches a smol LoRA student. The adapter starts away from the base (peft's
``init_lora_weights=False``: lora_B random instead of 0), so the student differs from its teacher; two steps of pure
distillation (a reward that never differs: TRL's advantage is 0, ``beta`` 0) move the student's log-probabilities
of a fixed batch toward the base's on the tokens the base prefers, and the adapter is all that moved."""

import math

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def completion_logps(model, output) -> torch.Tensor:
    """log softmax(logits)[y] of the completion tokens, one whole forward (temperature 1)."""
    with torch.no_grad():
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits.double()
        length = output["completion_ids"].size(1)
        logp = torch.log_softmax(logits[:, -length - 1 : -1], dim=-1)
    return logp.gather(-1, output["completion_ids"].unsqueeze(-1)).squeeze(-1)


def test_smol_base_teaches_its_lora_student(smol_path, smol_tokenizer, tmp_path):
    pytest.importorskip("peft")
    from helpers import cpu_config
    from peft import LoraConfig

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data import load_train_dataset

    args = cpu_config(tmp_path, strategies=["opd"], teacher_model="base", per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=16, max_steps=2, learning_rate=2e-3, logging_steps=1,
                      save_strategy="no", seed=0, temperature=1.0, beta=0.0)
    dataset = load_train_dataset("addition", num_prompts=16, seed=1)
    torch.manual_seed(0)
    trainer = SharpGRPOTrainer(
        model=smol_path, reward_funcs=[constant_reward], args=args, train_dataset=dataset,
        processing_class=smol_tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )  # fmt: skip
    torch.manual_seed(1)
    output = trainer._generate_and_score_completions([dataset[i // 4] for i in range(16)])
    model = trainer.model
    with model.disable_adapter():
        teacher = completion_logps(model, output)
    before = completion_logps(model, output)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    trainer.train()
    after = completion_logps(model, output)
    mask = output["completion_mask"].bool()
    gap, moved = (teacher - before)[mask], (after - before)[mask]
    assert gap.abs().mean() > 0.1, "the random adapter did not move the student away from its teacher"
    assert moved[gap > 0.5].mean() > 0 > moved[gap < -0.5].mean()
    assert (moved * gap).sum() > 0  # on the whole in the direction of d
    assert (teacher - after)[mask].abs().mean() < gap.abs().mean()  # closer to the teacher than before
    assert all(torch.equal(p.detach(), frozen[n]) for n, p in model.named_parameters() if n in frozen)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        for key in ("loss", "opd/teacher_logp_mean", "opd/gap_abs_mean"):
            assert math.isfinite(entry[key]), (key, entry)
