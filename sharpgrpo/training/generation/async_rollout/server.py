"""Asynchronous generation with a vLLM server as the rollout engine (``async_generation`` with ``use_vllm: true,
vllm_mode: server``).

The server already generates in a process of its own; what it needs to run ahead of the trainer is someone to ask it.
That is a thread of the trainer's process (:class:`ServerRolloutThread`) which takes, in order, two kinds of work from
one queue: *weights* (a copy of the policy's tensors, taken by the trainer when TRL syncs,
``VLLMGeneration.sync_weights`` being replaced by :meth:`ServerAsyncRollouts.enqueue_weights`; TRL syncs before each
``rollout_func`` call, ``trl/trainer/grpo_trainer.py`` lines 2200-2204) and *jobs* (a generation batch's prompts). It
pushes weights through TRL's client (``VLLMClient.update_named_params``: NCCL with CUDA, the ``sharpgrpo_file`` engine
without it, ``vllm_weight_files``) and generates through the same client with TRL's sampling parameters
(``VLLMGeneration.generate``, server branch, ``trl/generation/vllm_generation.py`` lines 616-631), so a job queued
after the weights of version v is generated with them: the bound of ``client.AsyncRollouts`` holds as with the
transformers rollout process, and weights never change on the server while it generates a batch. The server's sampling
log-probabilities come back as the rollout's ``logprobs`` (TRL's ``sampling_per_token_logps``); nothing is captured
from decoding steps (as with synchronous vLLM), so strategies that need hidden states or entropies compute them with
the trainer's forward. Each job samples with a seed of its own (``vllm_seeding.server_request_seed`` of its index), as
the synchronous server mode seeds each generation batch.
"""

from __future__ import annotations

import queue
import threading
import traceback
import weakref
from typing import Any

from sharpgrpo.training.generation.async_rollout.client import AsyncRollouts, predicted_prompts
from sharpgrpo.training.generation.vllm_seeding import server_generation_kwargs


class ServerRolloutThread(threading.Thread):
    """Pushes weights to the vLLM server and generates jobs with it, in the order they were queued (module
    docstring). ``None`` ends it; an error is sent back with its traceback and ends it."""

    exitcode = None  # read by AsyncRollouts' message when the rollout engine is gone

    def __init__(self, generation, args, jobs: queue.Queue, results: queue.Queue):
        super().__init__(name="sharpgrpo-vllm-rollouts", daemon=True)
        self.generation, self.args, self.jobs, self.results = generation, args, jobs, results
        self.loaded = -1

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                if "weights" in job:
                    self.push(job["weights"], job["version"])
                else:
                    self.results.put(self.generate(job))
            except BaseException as error:  # the trainer raises it, naming the rollout engine
                self.results.put({"index": job.get("index"), "error": f"{type(error).__name__}: {error}",
                                  "traceback": traceback.format_exc()})
                return

    def push(self, weights: list[tuple[str, Any]], version: int) -> None:
        client = self.generation.vllm_client
        metadata = [(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)) for name, tensor in weights]
        client.update_named_params(metadata, iter(weights))
        client.reset_prefix_cache()  # computed with the old weights (as TRL's sync does)
        self.loaded = version

    def generate(self, job: dict[str, Any]) -> dict[str, Any]:
        generation, num_generations = self.generation, job["num_generations"]
        output = generation.vllm_client.generate(
            prompts=job["prompt_ids"][::num_generations], n=num_generations,
            repetition_penalty=generation.repetition_penalty, temperature=generation.temperature,
            top_p=generation.top_p, top_k=generation.top_k, min_p=generation.min_p or 0.0,
            max_tokens=generation.max_completion_length, logprobs=generation.logprobs,
            structured_outputs_regex=generation.structured_outputs_regex,
            generation_kwargs=server_generation_kwargs(self.args, job["index"]))
        return {"index": job["index"], "completion_ids": output["completion_ids"], "captured": {},
                "logprobs": [[position[0] for position in row] for row in output["logprobs"]],
                "version": self.loaded, "rng_state": job["rng_state"], "cuda_rng_state": job["cuda_rng_state"]}


class ServerAsyncRollouts(AsyncRollouts):
    """``AsyncRollouts`` whose rollout engine is a vLLM server asked by :class:`ServerRolloutThread`. With several
    trainer processes, as TRL's synchronous server mode does, the main process asks the server for everyone's prompts
    (gathered) and every process takes its rows of the result (broadcast): one thread, so one order of weight pushes
    and jobs, and the same weight version on every process."""

    engine = "the thread asking the vLLM server"

    def _start_engine(self, trainer) -> None:
        """Start the thread (``self._process``; a LoRA policy is merged by TRL's own iterator) with its queues, on
        the main process; every process's TRL sync becomes :meth:`enqueue_weights`."""
        self._trainer = weakref.ref(trainer)
        trainer.vllm_generation.sync_weights = self.enqueue_weights  # TRL's sync, before each rollout_func call
        if not trainer.accelerator.is_main_process:
            return
        self._jobs, self._results = queue.Queue(), queue.Queue()
        self._process = ServerRolloutThread(trainer.vllm_generation, trainer.args, self._jobs, self._results)
        self._process.loaded = trainer.state.global_step  # TRL's own sync ran just before this first call
        self._process.start()

    def _predicted(self, trainer):
        """The read-ahead of the main process: each coming generation batch of every process, in process order (as
        TRL's server mode gathers the prompts)."""
        processes = range(trainer.accelerator.num_processes)
        streams = [predicted_prompts(trainer, process) for process in processes]
        return ([prompt for batch in batches for prompt in batch] for batches in zip(*streams))

    def _rollout(self, prompts: list[Any], trainer) -> dict[str, Any]:
        """With several processes: everyone's prompts gathered, the main process's result for all of them broadcast,
        and this process's rows of it (module docstring)."""
        accelerator = trainer.accelerator
        if accelerator.num_processes == 1:
            return super()._rollout(prompts, trainer)
        from accelerate.utils import broadcast_object_list, gather_object

        if not self._started:  # every process: TRL's sync becomes enqueue_weights; the thread on the main one only
            self._start(trainer)
        everyone = gather_object(prompts)
        result = super()._rollout(everyone, trainer) if accelerator.is_main_process else None
        result = broadcast_object_list([result], from_process=0)[0]
        rows = slice(accelerator.process_index * len(prompts), (accelerator.process_index + 1) * len(prompts))
        return {**result, **{key: result[key][rows] for key in ("prompt_ids", "completion_ids", "logprobs")}}

    @staticmethod
    def _stop(thread, jobs) -> None:
        if thread.is_alive():
            jobs.put(None)
            thread.join(timeout=60)

    def enqueue_weights(self) -> None:
        """TRL's ``sync_weights`` in its place: a copy of the policy's tensors as TRL's sync iterates them (ZeRO-3
        gathering, a PEFT merge), queued before the jobs submitted after it."""
        trainer = self._trainer()
        named = trainer.vllm_generation._iter_named_params()  # a collective under ZeRO-3: every process iterates
        if not trainer.accelerator.is_main_process:
            for _ in named:
                pass
            return
        weights = [(name, tensor.detach().clone()) for name, tensor in named]
        self._jobs.put({"weights": weights, "version": trainer.state.global_step})

    def _publish(self, trainer) -> None:
        """Nothing: TRL's sync, now :meth:`enqueue_weights`, runs before each call (the first call's ran as TRL's own,
        before the thread started, and is the version the thread starts from)."""

    def _job_settings(self, trainer, index: int) -> dict[str, Any]:
        """What the thread needs of a job beside its prompts: the completions per prompt (the server samples them)."""
        return {"num_generations": trainer.num_generations if trainer.model.training else trainer.num_generations_eval}
