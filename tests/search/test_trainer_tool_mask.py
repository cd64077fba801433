"""SharpGRPOTrainer hands its advantage strategies ``completion_mask * tool_mask``: what a retrieval put into a
completion (tool_mask == 0: token ids, and the hidden states and log-probabilities captured at generation) cannot
change any advantage of the model's own tokens. Fails if the trainer passed ``completion_mask`` alone."""

import pytest
import torch

from sharpgrpo.training.generation.advantage_pipeline import GenerationRecord

B, G, T = 8, 4, 10


def zero_reward_trainer(model_path, output_dir, strategies):
    from helpers import cpu_config, make_trainer

    args = cpu_config(output_dir, per_device_train_batch_size=B, num_generations=G, max_completion_length=T, seed=0,
                      strategies=strategies, thr_p=0.5)
    return make_trainer(model_path, args, reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(completions)],
                        train_dataset=B)


def batch(trainer, seed, tool_values_seed):
    """One generation batch; the tokens under tool_mask == 0 (and what was captured there) come from
    ``tool_values_seed``, everything else from ``seed``."""
    gen, tool_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(tool_values_seed)
    model = trainer.model
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    lengths = torch.tensor([10, 9, 8, 10, 7, 10, 9, 8])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    tool_mask = torch.ones(B, T, dtype=torch.long)
    tool_mask[:, 2:5] = 0  # a retrieved block inside every completion
    tool = tool_mask == 0

    def mixed(own, retrieved):
        return torch.where(tool.view(B, T, *([1] * (own.dim() - 2))), retrieved, own)

    ids = mixed(torch.randint(0, vocab, (B, T), generator=gen), torch.randint(0, vocab, (B, T), generator=tool_gen))
    hidden_states = mixed(torch.randn(B, T, hidden, generator=gen), torch.randn(B, T, hidden, generator=tool_gen))
    logps = mixed(-3 * torch.rand(B, T, generator=gen), -3 * torch.rand(B, T, generator=tool_gen))
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    groups = rewards.view(-1, G)
    advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
    trainer._generation = GenerationRecord(
        rewards_per_func=rewards[:, None], answer_verdicts=None, captured={"hidden": hidden_states, "logps": logps}
    )
    output = dict(
        prompt_ids=torch.ones(B, 3, dtype=torch.long), prompt_mask=torch.ones(B, 3, dtype=torch.long),
        completion_ids=ids, completion_mask=completion_mask, tool_mask=tool_mask, advantages=advantages,
        group_ids=torch.arange(B) // G,
    )
    return output, (tool_mask == 1) & (completion_mask == 1)


@pytest.mark.parametrize("strategies", [["thr"], ["cw_grpo"], ["thr", "cw_grpo"]], ids="+".join)
def test_retrieved_tokens_do_not_change_advantages(search_model_path, tmp_path, strategies):
    trainer = zero_reward_trainer(search_model_path, tmp_path, strategies)
    with torch.no_grad():
        output, own = batch(trainer, seed=0, tool_values_seed=1)
        reference = trainer._apply_advantage_strategies(output, G, "train")
        output, _ = batch(trainer, seed=0, tool_values_seed=2)  # other retrieved tokens, same own tokens
        changed = trainer._apply_advantage_strategies(output, G, "train")
        torch.testing.assert_close(changed[own], reference[own], atol=1e-6, rtol=1e-5)
        # The check has teeth: without the tool mask the retrieved tokens do change the advantages.
        output, _ = batch(trainer, seed=0, tool_values_seed=1)
        unmasked = trainer._apply_advantage_strategies(dict(output, tool_mask=None), G, "train")
        output, _ = batch(trainer, seed=0, tool_values_seed=2)
        unmasked_changed = trainer._apply_advantage_strategies(dict(output, tool_mask=None), G, "train")
        assert not torch.allclose(unmasked[own], unmasked_changed[own], atol=1e-4)
