"""Train the tiny model for a few steps and record what must not depend on the number of processes.

Run in-process (``run_case``) for the 1-process reference, and as a script under ``accelerate launch`` for the
multi-process runs of tests/integration/test_multiprocess.py::

    PYTHONPATH=tests accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 2 --mixed_precision no \
        tests/integration/_launch_worker.py --model MODEL_DIR --output_dir OUT \
        --cases '[{"strategies": "cw_grpo", "per_device_train_batch_size": 6}]'

(The multi-GPU config only selects torch's launcher; with ``use_cpu=True`` accelerate then sets up gloo on the CPU.)
Every process writes ``OUT/case_<i>/rank<k>.json``: the logged per-step losses and metrics (identical on every
rank), and its own rows of every generation batch (global row offset, completion ids and the token advantages
the advantage strategies returned), so a test can reassemble the global batch.

Generation. TRL samples on each process with that process's random stream, so the same global batch would be
sampled differently by 1 and by 2 processes and no loss could be compared. ``RowSeededTrainer`` therefore samples
every completion from the policy with its own generator, seeded by (seed, generation index, global row index):
the completions depend on the row, not on which process generates it. It is ordinary temperature sampling from
the model (token by token, one row at a time, so that no batch composition enters the logits); only the source
of randomness differs from TRL's.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from helpers import cpu_config, make_trainer  # tests/ is on PYTHONPATH under accelerate launch

from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer  # noqa: E402

# Strategy metrics compared across process counts (besides loss, grad_norm and reward).
COMPARED_PREFIXES = ("cw/", "thr/", "nthr/", "token_weight/", "ar/", "entropy_shaping/", "gtpo/", "ktae/", "opd/")


class RowSeededTrainer(SharpGRPOTrainer):
    """SharpGRPOTrainer whose sampling randomness is a function of the global row (see the module docstring);
    it also records each generation batch's rows and token advantages."""

    # Call the model max_completion_length times for every row, also after the row's EOS (those calls' outputs are
    # discarded and draw no random numbers): with sharded parameters every forward is a collective, so every process
    # must make the same number of them (FullyShardedTrainer).
    lockstep = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded_generations: list[dict[str, Any]] = []

    @torch.no_grad()
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        model = self.accelerator.unwrap_model(self.model)
        first_row = self.accelerator.process_index * len(prompt_ids)
        eos = set(self.eos_token_ids)
        completions = []
        for offset, ids in enumerate(prompt_ids):
            row = first_row + offset
            generator = torch.Generator().manual_seed(
                1_000_003 * self.args.seed + 10_007 * self._generation_count + row
            )
            sequence = torch.tensor([ids], device=self.accelerator.device)
            tokens: list[int] = []
            for _ in range(self.max_completion_length):
                logits = model(input_ids=sequence).logits[0, -1].float() / self.temperature
                if tokens and tokens[-1] in eos:  # lockstep: finished, the call only keeps the processes in step
                    continue
                token = int(torch.multinomial(torch.softmax(logits, dim=-1).cpu(), 1, generator=generator))
                tokens.append(token)
                if token in eos and not self.lockstep:
                    break
                if token not in eos:
                    sequence = torch.cat([sequence, sequence.new_tensor([[token]])], dim=1)
            completions.append(tokens)
        return completions, None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            advantages = output["advantages"]
            self.recorded_generations.append(
                {
                    "first_row": self.accelerator.process_index * output["completion_ids"].size(0),
                    "completion_ids": output["completion_ids"].tolist(),
                    "completion_mask": output["completion_mask"].tolist(),
                    "advantages": (advantages if advantages.dim() == 2 else advantages.unsqueeze(1)).tolist(),
                }
            )
        return output


class FullyShardedTrainer(RowSeededTrainer):
    """RowSeededTrainer on a model sharded by torch's FSDP2 ``fully_shard`` over all processes (gloo on the CPU):
    every decoder layer and the LM head a unit of its own, the embeddings and final norm in the root unit, as
    accelerate's FSDP2 plugin wraps a transformer (``TRANSFORMER_BASED_WRAP``) on GPUs. accelerate builds FSDP on
    GPUs only, so here the model is sharded by hand after the trainer is built and accelerate's ``prepare_model``
    (which on the CPU would wrap it in DDP) returns it as is; the optimizer then holds the DTensor shards, FSDP2
    reduce-scatters the gradients (averaged like DDP's) and accelerate's DTensor-aware clipping gives the norm."""

    lockstep = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (self.accelerator.num_processes,))
        lm = self.model
        for layer in lm.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(lm.lm_head, mesh=mesh)  # the head its own unit: outside its forward a DTensor row shard
        fully_shard(lm, mesh=mesh)
        self.accelerator.prepare_model = lambda model, *args, **kwargs: model


def build_config(output_dir: str, **overrides) -> SharpGRPOConfig:
    options = dict(
        seed=0,
        per_device_train_batch_size=8,
        num_generations=4,
        # Temperature 2 makes some completions end early or run past the warm-started length: ragged lengths, so
        # that padding across processes is exercised and the on-policy loss is not 0 (it is 0 for equal lengths).
        max_completion_length=12,
        temperature=2.0,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        learning_rate=0.05,
        optim="sgd",  # plain SGD: a wrong gradient scale across processes changes the next loss (Adam hides it)
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    options.update(overrides)
    return cpu_config(output_dir, **options)


def run_case(model_path: str, output_dir: str, trainer_class=RowSeededTrainer, **overrides) -> dict[str, Any]:
    """Train and return {"log": [per-step log dicts], "generations": [...], "process_index", "num_processes"}.

    ``overrides`` are SharpGRPOConfig fields, plus ``generation="trl"`` for TRL's own sampling (SharpGRPOTrainer)
    and ``resume_from_checkpoint``."""
    if overrides.pop("generation", "row_seeded") == "trl":
        trainer_class = SharpGRPOTrainer
    if overrides.pop("fsdp2", False):
        trainer_class = FullyShardedTrainer
    expect_error = overrides.pop("expect_error", False)  # record the construction's error instead of training
    if expect_error:
        try:
            args = build_config(output_dir, **overrides)
            make_trainer(model_path, args, train_dataset=64, trainer_class=trainer_class)
        except Exception as error:  # noqa: BLE001 - the test reads the type and message
            return {"error": f"{type(error).__name__}: {error}", "process_index": int(os.environ.get("RANK", 0))}
        return {"error": None, "process_index": int(os.environ.get("RANK", 0))}
    resume_from_checkpoint = overrides.pop("resume_from_checkpoint", None)
    args = build_config(output_dir, **overrides)
    trainer = make_trainer(model_path, args, train_dataset=64, trainer_class=trainer_class)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    log = [entry for entry in trainer.state.log_history if "loss" in entry]
    result = {
        "log": log,
        "generations": getattr(trainer, "recorded_generations", []),
        "process_index": trainer.accelerator.process_index,
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "param_sum": float(sum(_whole(p).double().sum() for p in trainer.model.parameters())),
        # This process's strategy state after training (e.g. the `random` generator), to compare resumed runs.
        "strategy_state": {
            name: {key: value.tolist() if torch.is_tensor(value) else value for key, value in state.items()}
            for name, state in trainer.strategy_state().items()
        },
        "teacher_numel": _local_and_whole_numel(getattr(trainer, "_teacher_engine", None)),
    }
    trainer.accelerator.wait_for_everyone()
    return result


def _local_and_whole_numel(model) -> list[int] | None:
    """[elements this process holds, elements of the whole model] of a prepared teacher (ZeRO-3: its partition)."""
    if model is None:
        return None
    parameters = list(model.parameters())
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in parameters)
    return [local, sum(getattr(p, "ds_numel", p.numel()) for p in parameters)]


def _whole(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value (an FSDP2 DTensor shard gathered)."""
    parameter = parameter.detach()
    return parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--cases", required=True, help="JSON list of run_case overrides, one per run")
    cli = parser.parse_args()
    for index, overrides in enumerate(json.loads(cli.cases)):
        folder = Path(cli.output_dir) / f"case_{index}"
        result = run_case(cli.model, str(folder / "run"), **overrides)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{result['process_index']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
