"""The trainer's side of asynchronous generation: TRL's ``rollout_func`` seam, a read-ahead of the data order, and
the bounded pipeline of jobs to the rollout process.

TRL 1.16's ``GRPOTrainer._generate`` hands a generation batch's prompts to ``rollout_func(prompts, trainer)`` and
takes back ``prompt_ids``, ``completion_ids`` and ``logprobs`` (the sampling policy's per-token log-probabilities,
which become ``sampling_per_token_logps``); rewards, advantages and the loss stay the trainer's. :class:`AsyncRollouts`
is that function. To generate a batch before the trainer asks for it, it reads the trainer's data order ahead: a
second data loader over the same dataset with the trainer's own sampler (TRL's seeded ``RepeatSampler``), every
``steps_per_generation * num_iterations``-th batch, as ``GRPOTrainer._prepare_inputs`` takes them. When the trainer's
prompts are the predicted ones, their completions were submitted ``max_staleness`` calls earlier; when they are not
(a resume, an evaluation, a refill), the jobs in flight are dropped, the read-ahead is moved to the trainer's
position, and the batch is generated on demand (``async/regenerated``).

Weights are published at every call (one version per generation batch, numbered by the trainer's ``global_step``);
a batch's staleness is the trainer's step minus the version it was generated with (``async/staleness``). At
``max_staleness: 0`` every batch is generated on demand with the current weights and the trainer's random state,
which comes back afterwards, so training equals the synchronous trainer's.

With several trainer processes each has a rollout process of its own and reads ahead its own share of the data order
(:func:`predicted_prompts`); the policy is published whole (``weights.whole_policy``: ZeRO-3 gathered, FSDP2's
DTensors made whole).
"""

from __future__ import annotations

import contextlib
import sys
import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from sharpgrpo.training.generation.async_rollout.weights import SharedMemoryWeights, whole_policy
from sharpgrpo.training.generation.async_rollout.worker import WorkerSpec, run_rollout_worker
from sharpgrpo.training.generation.policy_inputs import causal_lm

WAIT_POLL_SECONDS = 1.0
READ_AHEAD_LIMIT = 100_000  # batches searched for the trainer's position before generating on demand for good


class RolloutProcessError(RuntimeError):
    """The rollout process died or failed a job (one line; the engine's own traceback is chained to it)."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in the rollout engine, chained to the trainer's one-line
    :class:`RolloutProcessError` (printed with it by ``--debug``, as ``concurrent.futures`` chains a worker's)."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}"


def predicted_prompts(trainer, process_index: int | None = None) -> Iterator[list[Any]]:
    """The prompts of the generation batches that process ``process_index`` (default: this one) will ask for, in order
    (module docstring). With several processes each takes its share of the sampler's batches as accelerate's
    ``prepare_data_loader`` deals them (its ``BatchSamplerShard``, with the trainer's accelerator settings)."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, DataLoader

    accelerator = trainer.accelerator
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    batch_size = trainer._train_batch_size * trainer.args.steps_per_generation  # TRL's get_train_dataloader
    batches = BatchSampler(trainer._get_train_sampler(), batch_size, drop_last=trainer.args.dataloader_drop_last)
    if accelerator.num_processes > 1:
        batches = BatchSamplerShard(
            batches, num_processes=accelerator.num_processes,
            process_index=accelerator.process_index if process_index is None else process_index,
            split_batches=accelerator.split_batches, even_batches=accelerator.even_batches)
    loader = DataLoader(trainer.train_dataset, batch_sampler=batches, collate_fn=trainer.data_collator)
    position = 0
    while True:
        for batch in loader:
            if position % generate_every == 0:
                yield [row["prompt"] for row in batch]
            position += 1


@contextlib.contextmanager
def main_module_hidden():
    """Start a spawned process without re-running the caller's script in it: ``multiprocessing``'s spawn imports
    the parent's ``__main__`` in the child (by path, or by module name), which runs a script's training again when
    it has no ``if __name__ == "__main__"`` guard. The rollout process needs nothing of it (its entry point and
    arguments are sharpgrpo's and transformers'), so the main module's path and spec are hidden while it starts."""
    main = sys.modules["__main__"]
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    for name in saved:
        setattr(main, name, None) if name == "__spec__" else delattr(main, name)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


class AsyncRollouts:
    """TRL's ``rollout_func`` backed by the rollout process (module docstring); built unstarted, started by the first
    call, which has the trainer."""

    samples_trained_model = True  # its values are the trained policy's (``refuse_unavailable_sampling_entropy``)
    engine = "the rollout process"  # named in its errors

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self._process = None
        self._in_flight: deque[tuple[int, list[Any]]] = deque()  # (job index, prompts), oldest first
        self._stream: Iterator[list[Any]] | None = None
        self._index = 0
        self._prompt_ids: dict[int, list[list[int]]] = {}  # each job's tokenized prompts, until its batch is served
        self._published = None
        self._started = False

    # --- the rollout process ---------------------------------------------------------------------------------
    def _start(self, trainer) -> None:
        self._start_engine(trainer)
        if self._process is not None:
            weakref.finalize(self, type(self)._stop, self._process, self._jobs)
        self._stream = self._predicted(trainer) if self.max_staleness > 0 else None
        self._started = True

    def _predicted(self, trainer) -> Iterator[list[Any]]:
        """The read-ahead: the prompts of this process's coming generation batches (its rollout process serves it
        alone)."""
        return predicted_prompts(trainer)

    def _start_engine(self, trainer) -> None:
        """Start the rollout process (``self._process``) with its job and result queues."""
        context = torch.multiprocessing.get_context("spawn")
        model = causal_lm(trainer.accelerator, trainer.model)
        with whole_policy(trainer) as state:
            self._weights = SharedMemoryWeights(state, context)
        spec = WorkerSpec(
            model_config=model.config, generation_config=model.generation_config,
            trainer_generation_config=trainer.generation_config, generation_kwargs=trainer.generation_kwargs,
            dtype=next(model.parameters()).dtype, pad_token_id=trainer._tokenizer.pad_token_id,
            eos_token_ids=list(trainer.eos_token_ids), pad_to_multiple_of=trainer.pad_to_multiple_of,
            temperature=trainer.temperature, num_threads=torch.get_num_threads(), training_mode=model.training,
            device=str(next(model.parameters()).device),
        )
        self._jobs, self._results = context.Queue(), context.Queue()
        self._process = context.Process(target=run_rollout_worker, args=(spec, self._weights, self._jobs,
                                                                          self._results), daemon=True)
        with main_module_hidden():
            self._process.start()

    @staticmethod
    def _stop(process, jobs) -> None:
        if process.is_alive():
            jobs.put(None)
            process.join(timeout=10)
            if process.is_alive():
                process.kill()

    def close(self) -> None:
        if self._process is not None:
            self._stop(self._process, self._jobs)

    def _publish(self, trainer) -> None:
        step = trainer.state.global_step
        if step != self._published:
            with whole_policy(trainer) as state:
                self._weights.publish(state, step)
            self._published = step

    def _submit(self, trainer, prompts: list[Any], rng_state: torch.Tensor | None = None,
                cuda_rng_state: torch.Tensor | None = None) -> int:
        index, self._index = self._index, self._index + 1
        prompt_ids = self._prompt_ids[index] = trainer._tokenize_prompts(prompts)[0]
        self._jobs.put({"index": index, "prompt_ids": prompt_ids, "rng_state": rng_state,
                        "cuda_rng_state": cuda_rng_state, **self._job_settings(trainer, index)})
        return index

    def _job_settings(self, trainer, index: int) -> dict[str, Any]:
        """What the rollout process needs of a job beside its prompts: its seed and what to capture."""
        return {"seed": (trainer.args.seed * 1_000_003 + index) % 2**63, "capture": capture_wanted(trainer)}

    def _result(self, index: int) -> dict[str, Any]:
        """The result of job ``index``, waiting for it (results of dropped jobs are skipped); one line naming the
        rollout process if it died or failed."""
        while True:
            try:
                result = self._results.get(timeout=WAIT_POLL_SECONDS)
            except Exception:  # queue.Empty: still generating, unless the process is gone
                if not self._process.is_alive():
                    raise RolloutProcessError(
                        f"async_generation: {self.engine} exited (code {self._process.exitcode}) before "
                        "returning a batch; the trainer stops here.") from None
                continue
            if "error" in result:
                raise RolloutProcessError(f"async_generation: {self.engine} failed: {result['error']}") \
                    from RemoteTraceback(result["traceback"])
            if result["index"] == index:
                return result

    # --- TRL's rollout_func ----------------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer) -> dict[str, Any]:
        started = time.perf_counter()
        result = self._rollout(prompts, trainer)
        if trainer.model.training:
            metrics = trainer._metrics["train"]
            metrics["async/staleness"].append(float(trainer.state.global_step - result["version"]))
            metrics["async/wait_seconds"].append(time.perf_counter() - started)
            if result.get("regenerated"):
                metrics["async/regenerated"].append(1.0)
        wanted = capture_wanted(trainer)
        trainer._generation.captured = {key: value for key, value in result["captured"].items() if wanted.get(key)}
        logprobs = result.get("logprobs")  # a vLLM server's (``server.py``), else the rollout process's capture
        if logprobs is None:
            logps = result["captured"]["logps"]
            logprobs = [logps[row, :len(ids)].tolist() for row, ids in enumerate(result["completion_ids"])]
        return {"prompt_ids": result["prompt_ids"], "completion_ids": result["completion_ids"],
                "logprobs": logprobs,
                "policy_version": [result["version"]] * len(prompts)}  # TRL merges it into the rows (telemetry)

    def _rollout(self, prompts: list[Any], trainer) -> dict[str, Any]:
        """The rollout engine's result for ``prompts`` (``prompt_ids``, ``completion_ids``, ``captured``, the
        ``version`` of the weights it was generated with; ``regenerated`` when it was not the predicted batch)."""
        if not self._started:
            self._start(trainer)
        self._publish(trainer)
        if not trainer.model.training or self._stream is None:
            result = self._on_demand(trainer, prompts)
        else:
            result = self._pipelined(trainer, prompts)
        result["prompt_ids"] = self._prompt_ids.pop(result["index"])
        return result

    def _on_demand(self, trainer, prompts: list[Any]) -> dict[str, Any]:
        """Generate ``prompts`` now, with the current weights and the trainer's random state, which the trainer takes
        back (its stream continues as if it had generated the batch itself)."""
        device = trainer.accelerator.device
        cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        index = self._submit(trainer, prompts, rng_state=torch.get_rng_state(), cuda_rng_state=cuda_state)
        result = self._result(index)
        torch.set_rng_state(result["rng_state"])
        if cuda_state is not None:
            torch.cuda.set_rng_state(result["cuda_rng_state"], device)
        return result

    def _pipelined(self, trainer, prompts: list[Any]) -> dict[str, Any]:
        if self._in_flight and self._in_flight[0][1] == prompts:
            index, _ = self._in_flight.popleft()
            result = self._result(index)
        else:  # not the predicted batch: drop what is in flight, find the trainer's position, generate now
            regenerated = self._index > 0 or bool(self._in_flight)
            self._in_flight.clear()
            self._prompt_ids.clear()
            self._seek(prompts)
            result = {**self._result(self._submit(trainer, prompts)), "regenerated": regenerated}
        while self._stream is not None and len(self._in_flight) < self.max_staleness:
            upcoming = next(self._stream)
            self._in_flight.append((self._submit(trainer, upcoming), upcoming))
        return result

    def _seek(self, prompts: list[Any]) -> None:
        """Move the read-ahead just past the batch whose prompts are ``prompts``; without one in reach, generate on
        demand from now on."""
        for _ in range(READ_AHEAD_LIMIT):
            if next(self._stream) == prompts:
                return
        self._stream = None


def capture_wanted(trainer) -> dict[str, bool]:
    """What the trainer's own generation would read from ``generate`` for its strategies
    (``SharpGRPOTrainer._generate_single_turn``): the sampling log-probabilities where TRL computes no old ones,
    hidden states and entropies where a strategy needs them, all only with ``generation_capture``."""
    needs = trainer._needs()
    on = trainer.args.generation_capture
    return {"logps": on and needs.old_logps and not trainer._trl_computes_old_logps(),
            "hidden": on and needs.hidden_states, "entropy": on and needs.entropies}
