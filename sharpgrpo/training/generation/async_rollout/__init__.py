"""Asynchronous generation: a rollout process generates the next generation batches while the trainer trains.

Rooms: ``weights.py`` (the weight transfer: the policy's weights published into shared memory, one version per
generation batch), ``worker.py`` (the rollout process: a copy of the policy built from its config, the weights loaded
before each job, TRL's transformers generation and sharpgrpo's generation capture), ``client.py`` (the trainer's side:
TRL's ``rollout_func`` seam; the prompts of the coming generation batches read ahead from a second copy of the
trainer's data order, at most ``max_staleness`` batches in flight, the RNG handed over at staleness 0), ``server.py``
(with ``use_vllm: true, vllm_mode: server``: a thread that pushes the weights to the vLLM server and asks it for the
jobs, in order, instead of the rollout process), ``rollout_func.py`` (which of the two TRL gets) and ``checks.py``
(the settings asynchronous generation refuses, in one line, before any model loads).

Design (docs/methods.md §20): the staleness bound holds by construction. A batch is submitted ``max_staleness``
calls before the trainer asks for it, after the weights of that call were published, so the weights it is generated
with are at most ``max_staleness`` versions old; nothing is ever dropped for age (a dropping generator keeps the short
rollouts that finish first, which biases training toward them). With ``max_staleness: 0`` the trainer waits for each
batch, generated with its current weights and its own random state: the run equals the synchronous one.
"""
