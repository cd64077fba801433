"""The old (sampling) log-probabilities that advantage strategies read when TRL generates with vLLM
(docs/methods.md §13).

vLLM is not installed here, so TRL's vLLM generation is replaced by a stand-in that returns what vLLM returns to
TRL. TRL 1.16.0's vLLM branch (``trl/trainer/grpo_trainer.py`` of the installed trl 1.16.0, ``_generate_single_turn``,
lines 1768-1782) calls ``self.vllm_generation.sync_weights()`` when the step changed, then
``_, completion_ids, logprobs, _ = self.vllm_generation.generate(prompts=prompt_ids, images=images,
num_generations=num_generations, profiler=...)`` and keeps ``[[lp[0] for lp in seq] for seq in logprobs]``: per
row the completion token ids and, per token, a list of log-probabilities whose first is the sampled token's
(``VLLMGeneration.generate``'s docstring, ``trl/generation/vllm_generation.py`` lines 566-575). TRL starts its
colocated engine with ``logprobs_mode="processed_logprobs"`` (same file, line 361): the log-probabilities after the
temperature and after top-k/top-p/min-p truncation and renormalisation. The stand-in samples from the tiny policy
exactly that way (temperature, then top-k) and reports those processed log-probabilities.

What the strategies get (``Policy.strategy_inputs``, the tensor ``cw_grpo``/``ar`` read):
* untruncated sampling, no importance-sampling correction: vLLM's own log-probabilities, as TRL padded them;
* top-k sampling: the policy's own log-probabilities (a no-grad forward), never vLLM's truncated ones;
* ``vllm_importance_sampling_correction``: TRL's ``old_per_token_logps`` (the policy's own, recomputed by TRL).
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from helpers import binary_letters_reward, cpu_config, make_trainer

from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.training.generation.policy_inputs import old_logps_source, sampling_truncation, vllm_logps_problem


class VLLMStandIn:
    """Stands in for ``trainer.vllm_generation`` (colocate): samples each row from the policy at temperature T with
    top-k truncation (``top_k`` 0: none) and returns (prompt ids, completion ids, per-token [[processed logprob]],
    None), the 4-tuple TRL 1.16's vLLM branch unpacks."""

    def __init__(self, model, temperature: float, top_k: int, max_tokens: int, eos: int, seed: int = 0):
        self.model, self.temperature, self.top_k = model, temperature, top_k
        self.max_tokens, self.eos = max_tokens, eos
        self.generator = torch.Generator().manual_seed(seed)
        self.synced = 0
        self.returned_logprobs: list[list[float]] = []

    def sync_weights(self):
        self.synced += 1

    @torch.no_grad()
    def generate(self, prompts, images, num_generations, profiler=None):
        completions, logprobs = [], []
        with profiler or nullcontext():
            for ids in prompts:
                sequence, tokens, token_logprobs = torch.tensor([ids]), [], []
                for _ in range(self.max_tokens):
                    scaled = self.model(input_ids=sequence).logits[0, -1].float() / self.temperature
                    if self.top_k > 0:  # vLLM's top-k: the rest get -inf, then renormalise
                        kept = torch.topk(scaled, self.top_k).indices
                        scaled = torch.full_like(scaled, -torch.inf).index_copy(0, kept, scaled[kept])
                    processed = torch.log_softmax(scaled, dim=-1)
                    token = int(torch.multinomial(processed.exp(), 1, generator=self.generator))
                    tokens.append(token)
                    token_logprobs.append([float(processed[token])])  # top-1 first: the sampled token's
                    if token == self.eos:
                        break
                    sequence = torch.cat([sequence, torch.tensor([[token]])], dim=1)
                completions.append(tokens)
                logprobs.append(token_logprobs)
        self.returned_logprobs = [[lp[0] for lp in row] for row in logprobs]
        return prompts, completions, logprobs, None


def vllm_trainer(model_path, output_dir, top_k: int, importance_sampling: bool):
    args = cpu_config(output_dir, strategies="cw_grpo", per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, temperature=0.9, top_k=top_k, seed=0, generation_capture=False,
                      vllm_importance_sampling_correction=importance_sampling)
    trainer = make_trainer(model_path, args, reward_funcs=[binary_letters_reward], train_dataset=8)
    trainer.model.train()
    # TRL's vLLM path, with the engine replaced (building the real one needs vLLM and a GPU)
    trainer.use_vllm, trainer.vllm_mode = True, "colocate"
    trainer._last_loaded_step = -1  # what GRPOTrainer.__init__ sets beside the engine (grpo_trainer.py line 1140)
    trainer.vllm_generation = VLLMStandIn(trainer.model, trainer.temperature, top_k, trainer.max_completion_length,
                                          trainer.eos_token_ids[0])
    return trainer


def strategy_old_logps_of(trainer):
    from trl import GRPOTrainer

    output = GRPOTrainer._generate_and_score_completions(trainer, [demo_dataset(8)[i // 4] for i in range(8)])
    old_logps, _, _ = trainer._policy().strategy_inputs(output, {}, needs_hidden_states=False, needs_old_logps=True)
    with torch.no_grad():
        policy_logps = trainer._sampling_logps(output)
    returned = trainer.vllm_generation.returned_logprobs
    vllm_logps = torch.zeros_like(policy_logps)
    for row, values in enumerate(returned):
        vllm_logps[row, : len(values)] = torch.tensor(values)
    return output, old_logps, policy_logps, vllm_logps


def test_untruncated_vllm_logps_are_used(tiny_model_path, tmp_path):
    trainer = vllm_trainer(tiny_model_path, tmp_path, top_k=0, importance_sampling=False)
    output, old_logps, policy_logps, vllm_logps = strategy_old_logps_of(trainer)
    assert trainer.vllm_generation.synced == 1
    assert "old_per_token_logps" not in output  # on-policy, no IS correction: TRL computed none
    mask = output["completion_mask"].bool()
    assert torch.equal(old_logps[mask], vllm_logps[mask])  # vLLM's own, as returned
    torch.testing.assert_close(old_logps[mask], policy_logps[mask], atol=1e-5, rtol=1e-5)  # = the policy's


def test_truncated_vllm_logps_are_replaced_by_the_policys(tiny_model_path, tmp_path):
    trainer = vllm_trainer(tiny_model_path, tmp_path, top_k=3, importance_sampling=False)
    output, old_logps, policy_logps, vllm_logps = strategy_old_logps_of(trainer)
    mask = output["completion_mask"].bool()
    assert (vllm_logps[mask] - policy_logps[mask]).min() > 1e-4  # the truncated, renormalised ones are higher
    torch.testing.assert_close(old_logps[mask], policy_logps[mask], atol=0, rtol=0)  # the policy's own


def test_importance_sampling_correction_uses_trls_recomputed_logps(tiny_model_path, tmp_path):
    trainer = vllm_trainer(tiny_model_path, tmp_path, top_k=3, importance_sampling=True)
    output, old_logps, policy_logps, _ = strategy_old_logps_of(trainer)
    assert old_logps is output["old_per_token_logps"]
    mask = output["completion_mask"].bool()
    torch.testing.assert_close(old_logps[mask], policy_logps[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [((1.0, 0, None, None), None), ((0.9, 0, None, None), "top_p=0.9"),
     ((1.0, 20, 0.05, None), "top_k=20, min_p=0.05"), ((1.0, -1, 0.0, None), None),
     ((1.0, 0, None, {"top_p": 0.8}), "top_p=0.8")],
)
def test_sampling_truncation(fields, expected):
    assert sampling_truncation(*fields) == expected


def test_source_named_per_generation_path():
    assert "TRL's old_per_token_logps" in old_logps_source(True, "colocate", True, "top_k=3", False)
    assert "vLLM's own" in old_logps_source(True, "colocate", False, None, False)
    assert "recomputed" in old_logps_source(True, "colocate", False, "top_k=3", False)
    assert "top_k=3-truncated" in old_logps_source(True, "colocate", False, "top_k=3", False)
    assert "--logprobs-mode" in old_logps_source(True, "server", False, None, False)
    assert "decoding steps" in old_logps_source(False, None, False, "top_p=0.9", True)
    assert vllm_logps_problem("colocate", None) is None
