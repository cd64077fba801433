"""LoRA with a colocated vLLM engine on vLLM's CPU build: TRL merges the adapter into the base weights for the sync
(``VLLMGeneration._iter_named_params``), and the project's layerwise reload (``training/generation/vllm_sync.py``)
pushes the merged weights. After every step's sync the engine's log-probabilities of a fixed text equal the LoRA
policy's (adapter active) and differ from the base model's; after the optimizer step they differ from the policy's
until the next sync."""

from __future__ import annotations

from helpers import binary_letters_reward, tiny_config
from test_colocate_training import FIXED_TEXT, SYNC_TOLERANCE, SyncProbe, policy_logps, vllm_logps
from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM


class LoraSyncProbe(SyncProbe):
    """SyncProbe's records, plus the gap between the engine and the base model (the adapter disabled)."""

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        with self.trainer.model.disable_adapter():
            base = policy_logps(self.trainer.model, self.ids)
        engine = vllm_logps(self.trainer.vllm_generation.llm, self.ids)
        self.records[-1]["base_gap"] = (engine - base).abs().max().item()


def test_a_lora_policy_reaches_the_engine_merged_after_every_step(tiny_vllm_model, shared_engine, tmp_path):
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import demo_dataset

    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="colocate", max_steps=3, temperature=1.0,
                       learning_rate=2e-2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_vllm_model)
    trainer = SharpGRPOTrainer(model=tiny_vllm_model, reward_funcs=[binary_letters_reward], args=args,
                               train_dataset=demo_dataset(64), processing_class=tokenizer,
                               peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    ids = tokenizer(FIXED_TEXT)["input_ids"]
    probe = LoraSyncProbe(trainer, ids)
    trainer.add_callback(probe)
    trainer.train()
    print("LoRA sync probe per step:", probe.records)
    assert len(probe.records) == 3
    for step, record in enumerate(probe.records):
        assert record["synced_gap"] <= SYNC_TOLERANCE, (step, record)  # the merged policy reached the engine
    # from the second step on the adapter is non-zero at the sync: the engine holds base + B A, not the base
    assert all(record["base_gap"] > 10 * SYNC_TOLERANCE for record in probe.records[1:]), probe.records
    assert all(record["stale_gap"] > 10 * SYNC_TOLERANCE for record in probe.records), probe.records
