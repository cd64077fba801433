"""The rollout process: a copy of the policy that generates the jobs the trainer submits, with the latest weights.

``run_rollout_worker`` is the process's entry point. The model is built from the policy's config (no download, no
disk read) and takes the published weights (``weights.SharedMemoryWeights``) before each job whose version moved.
``generate_job`` is TRL 1.16's transformers generation (``GRPOTrainer._generate_single_turn``, its regular branch,
grpo_trainer.py lines 1813-1890: prompts left-padded with TRL's ``pad``, ``generate`` under TRL's
``_override_model_generation_config``, each completion cut after its first EOS) with sharpgrpo's generation capture
around it (``capture.GenerationCapture``: the sampling policy's log-probabilities of the sampled tokens, and the
hidden states and entropies the strategies ask for). Equality with the trainer's own generation at staleness 0 is
tests/integration/test_async_generation.py's parity test.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class WorkerSpec:
    """What the rollout process needs to build its model and generate as the trainer does (all picklable)."""

    model_config: Any
    generation_config: Any  # the policy model's own generation config (as loaded with it)
    trainer_generation_config: Any  # TRL's GRPOTrainer.generation_config, passed to generate
    generation_kwargs: dict | None
    dtype: torch.dtype
    pad_token_id: int
    eos_token_ids: list[int]
    pad_to_multiple_of: int | None
    temperature: float
    num_threads: int
    training_mode: bool
    device: str = "cpu"  # the trainer's device: the rollout process generates beside it


def build_model(spec: WorkerSpec) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(spec.model_config, dtype=spec.dtype)
    model.generation_config = spec.generation_config
    return model.to(spec.device).train(spec.training_mode)


@torch.no_grad()
def generate_job(model: torch.nn.Module, spec: WorkerSpec, job: dict[str, Any]) -> dict[str, Any]:
    """One job: ``prompt_ids`` (a list of token lists) -> ``completion_ids`` (token lists, cut after the first EOS)
    and the captured per-row values (``logps`` always; ``hidden``/``entropy`` when ``job["capture"]`` asks), with the
    random state set first (``job["rng_state"]``: the trainer's, handed over; else ``job["seed"]``) and returned."""
    from trl.models.utils import _override_model_generation_config
    from trl.trainer.utils import pad

    from sharpgrpo.training.generation.capture import GenerationCapture

    cuda = torch.device(spec.device).type == "cuda"
    if job.get("rng_state") is not None:
        torch.set_rng_state(job["rng_state"])
        if cuda:
            torch.cuda.set_rng_state(job["cuda_rng_state"], spec.device)
    else:
        torch.manual_seed(job["seed"])
    prompts = [torch.tensor(ids) for ids in job["prompt_ids"]]
    input_ids = pad(prompts, padding_value=spec.pad_token_id, padding_side="left",
                    pad_to_multiple_of=spec.pad_to_multiple_of).to(spec.device)
    attention_mask = pad([torch.ones_like(t) for t in prompts], padding_value=0, padding_side="left",
                         pad_to_multiple_of=spec.pad_to_multiple_of).to(spec.device)
    capture = job["capture"]
    with GenerationCapture(model, spec.temperature, logps=True, hidden=capture.get("hidden", False),
                           entropy=capture.get("entropy", False)) as capturing, \
            _override_model_generation_config(model, generation_kwargs=spec.generation_kwargs):
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                   generation_config=spec.trainer_generation_config)
    completion_ids = sequences[:, input_ids.size(1):]
    completion_ids = completion_ids.cpu()
    is_eos = torch.isin(completion_ids, torch.tensor(spec.eos_token_ids))
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    keep = torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1) <= eos_idx.unsqueeze(1)
    completions = [ids[kept].tolist() for ids, kept in zip(completion_ids, keep, strict=True)]
    captured = {name: value.cpu() for name, value in capturing.result(completions).items()}
    return {"index": job["index"], "completion_ids": completions, "captured": captured,
            "rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.cuda.get_rng_state(spec.device) if cuda else None}


def run_rollout_worker(spec: WorkerSpec, weights, jobs, results) -> None:
    """The process's loop: take a job, load the newest weights, generate, put the result (with the weights'
    version); ``None`` ends it. An error is sent back as one line with its traceback, and ends the process."""
    torch.set_num_threads(spec.num_threads)
    model = build_model(spec)
    loaded = -1
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            loaded = weights.load_into(model, loaded)
            result = generate_job(model, spec, job)
        except BaseException as error:  # the trainer raises it, naming the rollout process
            results.put({"index": job["index"], "error": f"{type(error).__name__}: {error}",
                         "traceback": traceback.format_exc()})
            return
        result["version"] = loaded
        results.put(result)
