"""Masks everywhere: tokens with mask 0 (retrieved passages) do not change any advantage strategy's output on the
other tokens. Each registered advantage strategy runs on a batch with masked spans inside the completions, whatever
the masked tokens hold, and (unless its statistic is per position) on the same batch with those spans cut out; the
outputs on the remaining tokens must agree."""

import pytest
import torch

from sharpgrpo import SharpGRPOConfig
from sharpgrpo.strategies import STRATEGIES, GenerationBatch

G, GROUPS, T, H, V = 4, 2, 12, 8, 24


def make_batch(seed):
    gen = torch.Generator().manual_seed(seed)
    rows = G * GROUPS
    lengths = torch.randint(6, T + 1, (rows,), generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    env = torch.zeros(rows, T)
    for row in range(rows):  # an observation span inside each completion
        start = int(torch.randint(1, 3, (1,), generator=gen))
        env[row, start : start + 3] = 1
    env = env * mask
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 0, 0])
    group = rewards.view(GROUPS, G)
    adv = ((group - group.mean(1, keepdim=True)) / (group.std(1, keepdim=True) + 1e-4)).view(-1)
    return dict(
        old_logps=-torch.rand(rows, T, generator=gen) * 3,
        loss_mask=mask * (1 - env),
        completion_ids=torch.randint(0, V, (rows, T), generator=gen),
        advantages=adv.unsqueeze(1).expand(rows, T).clone(),
        rewards=rewards,
        group_ids=torch.arange(GROUPS).repeat_interleave(G),
        hidden_states=torch.randn(rows, T, H, generator=gen),
        unembedding_weight=torch.randn(V, H, generator=gen),
        entropies=torch.rand(rows, T, generator=gen) * 2,
        # every generation input an advantage strategy names (e.g. a teacher's log-probabilities), per token
        **{f"extra:{name}": -torch.rand(rows, T, generator=gen) * 3 for name in GENERATION_INPUTS_NEEDED},
    )


def to_batch(parts):
    return GenerationBatch(
        old_logps=parts["old_logps"], completion_mask=parts["loss_mask"], completion_ids=parts["completion_ids"],
        advantages=parts["advantages"], rewards=parts["rewards"], group_ids=parts["group_ids"], num_generations=G,
        hidden_states=parts["hidden_states"], unembedding_weight=parts["unembedding_weight"], unembedding_bias=None,
        temperature=1.0, entropies=parts["entropies"],
        extras={key.split(":", 1)[1]: value for key, value in parts.items() if key.startswith("extra:")},
    )


def compact(parts):
    """The same batch with the masked tokens removed (valid tokens moved left, right padded)."""
    keep = parts["loss_mask"].bool()
    out = dict(parts)
    for key in ("old_logps", "completion_ids", "advantages", "hidden_states", "loss_mask", "entropies",
                *(key for key in parts if key.startswith("extra:"))):
        value = parts[key]
        new = torch.zeros_like(value)
        for row in range(value.size(0)):
            kept = value[row][keep[row]]
            new[row, : kept.size(0)] = kept
        out[key] = new
    return out


# Every registered advantage strategy (a new one is tested here without editing this file).
ADVANTAGE_STRATEGIES = [name for name in STRATEGIES.names() if STRATEGIES.get(name).kind == "advantage"]
GENERATION_INPUTS_NEEDED = sorted({name for s in ADVANTAGE_STRATEGIES for name in STRATEGIES.get(s).needs_inputs})
# Statistics over the completions' tokens at the same position t (GTPO Eq. 3: the correct completions alive at t; OTB's
# baseline B[t], docs/methods.md §14, which `tir_otb` aligns by masked-in rank instead), so removing a masked span
# moves the later tokens to other positions: only the masked tokens' content is tested.
POSITION_ALIGNED = {"gtpo", "otb"}


@pytest.fixture(scope="module")
def args(tmp_path_factory):
    return SharpGRPOConfig(output_dir=str(tmp_path_factory.mktemp("out")), strategies="equal", num_generations=G,
                           use_cpu=True, report_to="none", passk_k=2)


@pytest.mark.parametrize("name", ADVANTAGE_STRATEGIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_masked_tokens_do_not_change_strategy_outputs(args, name, seed):
    strategy = STRATEGIES.get(name)(args)
    parts = make_batch(seed)
    masked = parts["loss_mask"] == 0
    garbage = dict(parts)  # arbitrary content on the masked tokens
    garbage["old_logps"] = parts["old_logps"].masked_fill(masked, -20.0)
    garbage["completion_ids"] = parts["completion_ids"].masked_fill(masked, 3)
    garbage["hidden_states"] = parts["hidden_states"].masked_fill(masked.unsqueeze(-1), 50.0)
    garbage["entropies"] = parts["entropies"].masked_fill(masked, 9.0)
    for key in (key for key in parts if key.startswith("extra:")):
        garbage[key] = parts[key].masked_fill(masked, -20.0)
    full, _ = strategy.token_advantages(to_batch(garbage))
    keep = parts["loss_mask"].bool()
    clean, _ = strategy.token_advantages(to_batch(parts))  # the same layout: the masked tokens' content is not read
    torch.testing.assert_close(full[keep], clean[keep], rtol=1e-5, atol=1e-6)
    if name in POSITION_ALIGNED:
        return
    short_parts = compact(parts)
    short, _ = strategy.token_advantages(to_batch(short_parts))
    for row in range(full.size(0)):
        n = int(keep[row].sum())
        torch.testing.assert_close(full[row][keep[row]], short[row, :n], rtol=1e-5, atol=1e-6)
