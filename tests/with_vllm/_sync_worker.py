"""Run by ``accelerate launch`` from ``test_two_processes.py``: each process trains the tiny vLLM model 3 steps with
its colocated engine and records, per step, the gap between its engine's log-probabilities of a fixed text and the
policy's at the sync (gathered from the shards under ZeRO-3) and after the optimizer step; writes them per rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class FullPolicy:
    """A plain copy of the policy, refreshed from the trainer's parameters (gathered from the shards under ZeRO-3, read
    only: no forward runs through DeepSpeed's module, whose hooks a probe must not disturb)."""

    def __init__(self, model_path: str):
        from transformers import AutoModelForCausalLM

        self.copy = AutoModelForCausalLM.from_pretrained(model_path, dtype="float32").eval()

    def logps(self, trainer, ids):
        import contextlib

        import torch
        from test_colocate_training import policy_logps

        params = dict(trainer.model.named_parameters())
        gather = contextlib.nullcontext()
        if trainer.is_deepspeed_enabled:
            import deepspeed

            gather = deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None)
        with gather, torch.no_grad():
            for name, param in self.copy.named_parameters():
                param.copy_(params[name].data.reshape(param.shape))
        return policy_logps(self.copy, ids)


def main(model: str, output_dir: str, probe: bool = True) -> None:
    import trl.generation.vllm_generation as trl_vllm
    from helpers import binary_letters_reward, make_trainer

    real_llm = trl_vllm.LLM  # the engine in the policy's float32, as the single-process tests run it (with_vllm's
    trl_vllm.LLM = lambda **kwargs: real_llm(**{"dtype": "float32", **kwargs})  # conftest.py, ENGINE_DTYPE)
    from test_colocate_training import FIXED_TEXT, vllm_config, vllm_logps
    from transformers import TrainerCallback

    full = FullPolicy(model)  # before the config: afterwards transformers would load it into ZeRO-3's shards too
    trainer = make_trainer(model, vllm_config(output_dir, max_steps=3, temperature=1.0, per_device_train_batch_size=8),
                           reward_funcs=[binary_letters_reward])
    ids = trainer.processing_class(FIXED_TEXT)["input_ids"]
    records = []

    class Probe(TrainerCallback):
        before = None

        def on_step_begin(self, args, state, control, **kwargs):
            Probe.before = full.logps(trainer, ids)

        def on_step_end(self, args, state, control, **kwargs):
            engine = vllm_logps(trainer.vllm_generation.llm, ids)
            after = full.logps(trainer, ids)
            records.append({"synced_gap": (engine - Probe.before).abs().max().item(),
                            "stale_gap": (engine - after).abs().max().item()})

    if probe:
        trainer.add_callback(Probe())
    trainer.train()
    rank = trainer.accelerator.process_index
    Path(output_dir, f"sync_rank{rank}.json").write_text(json.dumps(
        {"records": records, "deepspeed": trainer.is_deepspeed_enabled, "processes": trainer.accelerator.num_processes}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], probe=sys.argv[3:] != ["--no-probe"])
