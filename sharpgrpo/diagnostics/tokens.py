"""Which tokens a token-weight strategy favours: GRPO-SG App. C.3's word-cloud analysis, as a table and a bar chart.

GRPO-SG ranks frequently occurring tokens by their mean model probability
``mean_p(o) = (1 / #occ(o)) * sum_occurrences p(o)`` and shows the top 100 high- and low-probability tokens (GRPO-SG
Figure 3: structure tokens are confident, generic words are not). Here each listed token also gets its mean weight
under the configured strategy, ``strategy.weights(logps, mask)`` on the same temperature-scaled log-probabilities
the trainer uses, so the table shows directly which tokens the strategy up- or down-weights.

Completions come from a run's saved completions (``train.py``'s ``save_completions: true``, on in the demo, or TRL's
``log_completions=True`` write ``output_dir/completions/completions_<step>.parquet``) or are sampled from the model for given prompts.

    sharpgrpo tokens --model RUN_DIR --completions RUN_DIR/completions --output DIR
    sharpgrpo tokens --model sharpgrpo-tiny --prompts prompts.jsonl --output DIR

(the command line is ``sharpgrpo.cli.tokens``).

What a run actually trained on, for every strategy (advantage strategies included), is read from its per-token
telemetry instead, with no model (``sharpgrpo.diagnostics.telemetry``; ``sharpgrpo tokens --telemetry``).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sharpgrpo.diagnostics.token_page import token_pieces, write_token_page
from sharpgrpo.evaluation.generation import encode_prompts
from sharpgrpo.evaluation.report import markdown_table


@dataclass
class TokenTotals:
    """Per-vocabulary-id sums over the analysed completion tokens (1-D tensors of length V, float64)."""

    count: torch.Tensor
    prob: torch.Tensor
    weight: torch.Tensor

    @classmethod
    def zeros(cls, vocab_size: int) -> TokenTotals:
        return cls(*(torch.zeros(vocab_size, dtype=torch.float64) for _ in range(3)))

    def add(self, ids: torch.Tensor, probs: torch.Tensor, weights: torch.Tensor) -> None:
        """Accumulate flat (N,) token ids with their probabilities and weights."""
        size = self.count.numel()
        ids = ids.cpu().long()
        self.count += torch.bincount(ids, minlength=size).double()
        self.prob += torch.bincount(ids, weights=probs.cpu().double(), minlength=size)
        self.weight += torch.bincount(ids, weights=weights.cpu().double(), minlength=size)


def weight_strategy(strategy: str | None = None, config: Any = None, **overrides):
    """``(strategy object, config, name)``: a registered token-weight strategy built from ``config`` (default: a
    ``SharpGRPOConfig`` with ``strategies=[strategy]`` and ``overrides``, e.g. ``sg_tau=0.2``); without ``strategy``
    the config's own token-weight strategy."""
    from sharpgrpo.strategies import STRATEGIES

    if config is None:
        from sharpgrpo.config import SharpGRPOConfig

        overrides = {"bf16": False, "report_to": [], **overrides}  # only the strategy parameters are used
        with tempfile.TemporaryDirectory() as output_dir:
            config = SharpGRPOConfig(output_dir=output_dir, strategies=[strategy or "grpo_sg"], **overrides)
    if strategy is None:
        strategy = next((n for n in config.strategies if STRATEGIES.get(n).kind == "weight"), None)
        if strategy is None:
            raise ValueError(f"The config's strategies {config.strategies} hold no token-weight strategy.")
    cls = STRATEGIES.get(strategy)
    if cls.kind != "weight":
        raise ValueError(
            f"{strategy!r} is an advantage strategy; this analysis needs a token-weight strategy (grpo_sg, reverse, "
            "random, equal). Advantage strategies are read from a run's per-token telemetry "
            "(sharpgrpo.diagnostics.telemetry: train with token_telemetry: true, then sharpgrpo tokens --telemetry)."
        )
    return cls(config), config, strategy


@torch.no_grad()
def completion_logps(
    model, tokenizer, prompts: Sequence[Any], completions: Sequence[str], temperature: float = 1.0,
    batch_size: int = 8, apply_chat_template: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """Per completion, ``(token ids (T,), temperature-scaled log-probabilities (T,))`` under ``model``.

    As in TRL: the prompt is left-padded, the completion right-padded, logits are divided by the temperature before
    the log-softmax. Completion text is re-tokenised without special tokens.
    """
    device = next(model.parameters()).device
    prompt_ids = encode_prompts(tokenizer, prompts, apply_chat_template)
    completion_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in completions]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    results = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts_batch = prompt_ids[start : start + batch_size]
        completions_batch = completion_ids[start : start + batch_size]
        p_width = max(len(p) for p in prompts_batch)
        c_width = max(1, max(len(c) for c in completions_batch))
        rows, masks = [], []
        for p, c in zip(prompts_batch, completions_batch, strict=True):
            rows.append([pad] * (p_width - len(p)) + p + c + [pad] * (c_width - len(c)))
            masks.append([0] * (p_width - len(p)) + [1] * (len(p) + len(c)) + [0] * (c_width - len(c)))
        input_ids = torch.tensor(rows, device=device)
        logits = model(input_ids=input_ids, attention_mask=torch.tensor(masks, device=device)).logits
        logits = logits[:, p_width - 1 : p_width + c_width - 1].float() / temperature
        logps = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, p_width:, None]).squeeze(-1)
        for row, c in enumerate(completions_batch):
            results.append((torch.tensor(c, dtype=torch.long), logps[row, : len(c)].cpu()))
    return results


def completion_weights(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], strategy) -> list[torch.Tensor]:
    """Per ``(ids, logps)`` pair, the strategy's (T,) token weights, computed on the completions as one right-padded
    (B, T) batch with its mask, as the trainer does."""
    if not pairs:
        return []
    width = max(1, max(ids.numel() for ids, _ in pairs))
    logps = torch.zeros(len(pairs), width, dtype=torch.float32)
    mask = torch.zeros(len(pairs), width, dtype=torch.float32)
    for row, (token_ids, token_logps) in enumerate(pairs):
        logps[row, : token_ids.numel()] = token_logps
        mask[row, : token_ids.numel()] = 1
    weights = strategy.weights(logps, mask).float()
    return [weights[row, : ids.numel()] for row, (ids, _) in enumerate(pairs)]


def token_totals(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], strategy, vocab_size: int,
    weights: Sequence[torch.Tensor] | None = None,
) -> TokenTotals:  # fmt: skip
    """Sum count, probability and strategy weight per token id over ``(ids, logps)`` pairs (``weights``: their
    :func:`completion_weights`, computed here when None)."""
    totals = TokenTotals.zeros(vocab_size)
    weights = completion_weights(pairs, strategy) if weights is None else weights
    for (ids, logps), row_weights in zip(pairs, weights, strict=True):
        if ids.numel():
            totals.add(ids, logps.exp(), row_weights)
    return totals


def display_token(text: str) -> str:
    """A token's text with its whitespace visible (space as U+2423, newlines and tabs escaped)."""
    if text == "":
        return "''"
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r").replace(" ", "␣")


def rank_tokens(
    totals: TokenTotals, tokenizer, top: int = 100, min_count: int = 5, exclude_ids: Sequence[int] = ()
) -> dict[str, list[dict[str, Any]]]:
    """The ``top`` highest- and lowest-mean-probability tokens among those seen at least ``min_count`` times.

    The two lists never share a token: with fewer than ``2 * top`` candidates the upper half goes to ``high``.

    Each entry: ``token_id``, ``token`` (display form), ``count``, ``mean_prob``, ``mean_weight``. ``high`` is sorted
    by decreasing mean probability, ``low`` by increasing (ties by count, then id).
    """
    count = totals.count
    frequent = (count >= max(1, min_count)).clone()
    for token_id in exclude_ids:
        if 0 <= token_id < frequent.numel():
            frequent[token_id] = False
    candidates = frequent.nonzero().flatten().tolist()
    mean_prob = totals.prob / count.clamp(min=1)
    mean_weight = totals.weight / count.clamp(min=1)

    def entry(token_id: int) -> dict[str, Any]:
        return {
            "token_id": token_id,
            "token": display_token(tokenizer.decode([token_id])),
            "count": int(count[token_id]),
            "mean_prob": mean_prob[token_id].item(),
            "mean_weight": mean_weight[token_id].item(),
        }

    # With fewer than 2 * top candidates the two lists split them instead of overlapping.
    n_high = min(top, math.ceil(len(candidates) / 2))
    n_low = min(top, len(candidates) - n_high)
    high = sorted(candidates, key=lambda t: (-mean_prob[t].item(), -count[t].item(), t))[:n_high]
    low = sorted(candidates, key=lambda t: (mean_prob[t].item(), -count[t].item(), t))[:n_low]
    return {"high": [entry(t) for t in high], "low": [entry(t) for t in low]}


def tokens_markdown(ranking: dict[str, list[dict]], strategy: str, overall: dict[str, float]) -> str:
    text = (
        f"Token analysis under `{strategy}`: {overall['tokens']} completion tokens, mean probability "
        f"{overall['mean_prob']:.3f}, mean weight {overall['mean_weight']:.3f}.\n\n"
    )
    for side, title in (("high", "High-probability tokens"), ("low", "Low-probability tokens")):
        rows = [
            [rank, f"`{e['token']}`", e["count"], f"{e['mean_prob']:.3f}", f"{e['mean_weight']:.3f}"]
            for rank, e in enumerate(ranking[side], 1)
        ]
        text += f"{title}\n\n" + markdown_table(["Rank", "Token", "Count", "Mean prob", "Mean weight"], rows) + "\n"
    return text


def plot_token_weights(
    ranking: dict[str, list[dict]], path: str | Path, strategy: str, top: int = 25,
    bounds: tuple[float, float] | None = None,
) -> None:  # fmt: skip
    """Two horizontal bar panels (high / low probability tokens): bar = mean weight, label = mean probability and
    count; the strategy's weight bounds as dashed lines; both panels share the weight axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = [("high", "High-probability tokens", "tab:blue"), ("low", "Low-probability tokens", "tab:orange")]
    rows = max(1, max(len(ranking[s][:top]) for s, _, _ in sides))
    all_weights = [e["mean_weight"] for s, _, _ in sides for e in ranking[s][:top]] + list(bounds or ())
    with plt.rc_context({"text.parse_math": False}):  # tokens such as "$" are not mathtext
        fig, axes = plt.subplots(1, 2, figsize=(11, 1.2 + 0.28 * rows), sharex=True)
        for ax, (side, title, color) in zip(axes, sides, strict=True):
            entries = ranking[side][:top]
            labels = [e["token"] for e in entries]
            weights = [e["mean_weight"] for e in entries]
            positions = list(range(len(entries)))[::-1]
            ax.barh(positions, weights, color=color, alpha=0.8)
            ax.set_yticks(positions, labels, fontsize=8)
            for y, e in zip(positions, entries, strict=True):
                ax.text(e["mean_weight"], y, f" p={e['mean_prob']:.2f} n={e['count']}", va="center", fontsize=7)
            for bound in bounds or ():
                ax.axvline(bound, color="gray", linestyle="--", linewidth=0.8)
            ax.set_xlabel("mean token weight")
            ax.set_title(title, fontsize=10)
            ax.grid(axis="x", alpha=0.3)
        if all_weights:
            low, high = min(all_weights), max(all_weights)
            margin = max(0.05, 0.1 * (high - low))
            axes[0].set_xlim(max(0.0, low - margin), high + 4 * margin)  # room for the labels
        fig.suptitle(f"Mean {strategy} weight of the most/least probable frequent tokens (dashed: weight bounds)")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def read_logged_completions(path: str | Path, max_rows: int | None = None) -> tuple[list[Any], list[str]]:
    """``(prompts, completions)`` from TRL's ``completions_<step>.parquet`` files (a file or their folder)."""
    prompts, completions, _ = read_logged_rows(path, max_rows)
    return prompts, completions


def read_logged_rows(path: str | Path, max_rows: int | None = None) -> tuple[list[Any], list[str], list[dict]]:
    """``(prompts, completions, scores)``: :func:`read_logged_completions` plus, per row, the other columns (step,
    each reward function's value, advantage)."""
    import pandas as pd

    path = Path(path)
    files = sorted(path.glob("completions_*.parquet")) if path.is_dir() else ([path] if path.is_file() else [])
    if not files:
        raise FileNotFoundError(
            f"No completions_*.parquet in {path}: train with `save_completions: true` (train.py; on in "
            "configs/demo.yaml) or TRL's `log_completions: true`, which write them to output_dir/completions."
        )
    prompts, completions, scores = [], [], []
    for file in files:
        frame = pd.read_parquet(file)
        score_columns = [c for c in frame.columns if c not in ("prompt", "completion")]
        scores += [{c: _plain(v) for c, v in row.items()} for row in frame[score_columns].to_dict("records")]
        for prompt, completion in zip(frame["prompt"], frame["completion"], strict=True):
            prompts.append(_plain(prompt))
            completion = _plain(completion)
            if isinstance(completion, list):  # conversational: the assistant messages' text
                completion = "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
            completions.append(completion)
    if max_rows is not None:
        prompts, completions, scores = prompts[:max_rows], completions[:max_rows], scores[:max_rows]
    return prompts, completions, scores


def _plain(value: Any) -> Any:
    """Parquet returns message lists as numpy arrays of dicts and numbers as numpy scalars; make them Python's."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list):
        return [_plain(v) if not isinstance(v, dict) else {k: _plain(x) for k, x in v.items()} for v in value]
    return value


def run_setting_fields() -> tuple[str, ...]:
    """The fields of a run's config that change the analysed probabilities and weights: the temperature and every
    registered weight strategy's own parameters (``params``, beyond how any weight enters the loss)."""
    from sharpgrpo.strategies import STRATEGIES, TokenWeightStrategy

    weight_classes = [STRATEGIES.get(name) for name in STRATEGIES.names() if STRATEGIES.get(name).kind == "weight"]
    own = (p for cls in weight_classes for p in cls.params if p not in TokenWeightStrategy.params)
    return ("temperature", *dict.fromkeys(own))


def saved_training_args(*places: str | Path | None) -> tuple[dict[str, Any], Path | None]:
    """``(arguments, file)`` of the first ``training_args.json`` found in ``places`` or their parent folders (a
    run's output_dir, a ``checkpoint-N`` in it, or its ``completions`` folder), which train.py writes;
    ``({}, None)`` when there is none."""
    for place in places:
        if place is None:
            continue
        folder = Path(place) if Path(place).is_dir() else Path(place).parent
        for candidate in (folder / "training_args.json", folder.parent / "training_args.json"):
            try:
                return json.loads(candidate.read_text(encoding="utf-8")), candidate
            except (OSError, json.JSONDecodeError):
                continue
    return {}, None


def run_settings(*places: str | Path | None) -> tuple[dict[str, Any], list[str], Path | None]:
    """``(settings, strategies, file)`` from a run's ``training_args.json`` (:func:`saved_training_args`):
    the fields of :func:`run_setting_fields` and the strategy list; ``({}, [], None)`` when there is none."""
    saved, file = saved_training_args(*places)
    strategies = saved.get("strategies") or []
    strategies = [strategies] if isinstance(strategies, str) else list(strategies)
    return {k: saved[k] for k in run_setting_fields() if saved.get(k) is not None}, strategies, file


def read_prompts(path: str | Path) -> list[Any]:
    """Prompts from a ``.jsonl`` file (a ``prompt`` field per line) or a text file (one prompt per line)."""
    path = Path(path)
    with open(path, encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in lines]
    return [line.replace("\\n", "\n") for line in lines]


def analyze_tokens(
    model,
    tokenizer,
    prompts: Sequence[Any],
    completions: Sequence[str] | None = None,
    strategy: str | None = None,
    config: Any = None,
    temperature: float | None = None,
    num_samples: int = 4,
    max_new_tokens: int = 256,
    top: int = 100,
    min_count: int = 5,
    batch_size: int = 8,
    apply_chat_template: bool = False,
    output: str | Path | None = None,
    chart_top: int = 25,
    seed: int = 0,
    scores: Sequence[dict[str, Any]] | None = None,
    **overrides,
) -> dict[str, Any]:
    """Rank tokens by mean probability and report their mean strategy weight.

    Args:
        model, tokenizer: the policy whose probabilities are analysed.
        prompts: prompts (strings or message lists); with ``completions`` one per completion, else sampled from.
        completions: completion texts (e.g. :func:`read_logged_completions`); None samples ``num_samples`` per
            prompt at ``temperature`` with at most ``max_new_tokens`` tokens.
        strategy, config, overrides: the token-weight strategy (see :func:`weight_strategy`).
        temperature: scales the logits (default: the config's ``temperature``, as in training).
        top, min_count: table size, and how often a token must occur to be ranked.
        output: folder for ``tokens.json``, ``tokens.md``, ``tokens.png`` and ``tokens.html`` (every completion,
            each token shaded by its weight; nothing written when None).
        scores: per completion, the values shown above it on the page (e.g. rewards and advantage of a run).
    """
    strategy_object, config, strategy_name = weight_strategy(strategy, config, **overrides)
    temperature = float(config.temperature if temperature is None else temperature)
    if completions is None:
        from sharpgrpo.evaluation.generation import DecodingSettings, TransformersGenerator

        generator = TransformersGenerator(model, tokenizer, max(batch_size, num_samples), apply_chat_template)
        settings = DecodingSettings(max_new_tokens, greedy=False, n=num_samples, temperature=temperature, top_p=1.0)
        samples = generator.generate(prompts, settings, seed=seed)
        prompts = [p for p, s in zip(prompts, samples, strict=True) for _ in s]
        completions = [sample["text"] for s in samples for sample in s]
    elif len(completions) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions; give one prompt per completion.")
    pairs = completion_logps(model, tokenizer, prompts, completions, temperature, batch_size, apply_chat_template)
    vocab_size = max(model.get_output_embeddings().weight.shape[0], len(tokenizer))
    weights = completion_weights(pairs, strategy_object)
    totals = token_totals(pairs, strategy_object, vocab_size, weights)
    ranking = rank_tokens(totals, tokenizer, top, min_count, exclude_ids=tokenizer.all_special_ids)
    n_tokens = int(totals.count.sum().item())
    overall = {
        "tokens": n_tokens,
        "completions": len(completions),
        "mean_prob": totals.prob.sum().item() / max(n_tokens, 1),
        "mean_weight": totals.weight.sum().item() / max(n_tokens, 1),
    }
    result = {
        "strategy": strategy_name,
        "temperature": temperature,
        "min_count": min_count,
        "overall": overall,
        "weight_bounds": list(strategy_object.bounds()),
        **ranking,
    }
    if output is not None:
        output = Path(output)
        output.mkdir(parents=True, exist_ok=True)
        (output / "tokens.json").write_text(json.dumps(result, indent=2) + "\n")
        (output / "tokens.md").write_text(tokens_markdown(ranking, strategy_name, overall))
        plot_token_weights(ranking, output / "tokens.png", strategy_name, chart_top, strategy_object.bounds())
        page = [
            {
                "prompt": prompt, "pieces": token_pieces(tokenizer, ids.tolist()), "probs": logps.exp().tolist(),
                "weights": row_weights.tolist(), "scores": dict(scores[row]) if scores is not None else {},
            }
            for row, (prompt, (ids, logps), row_weights) in enumerate(zip(prompts, pairs, weights, strict=True))
        ]  # fmt: skip
        settings = {"temperature": temperature, **{k: getattr(config, k) for k in run_setting_fields() if k.startswith("sg_")}}
        write_token_page(output / "tokens.html", page, strategy_name, strategy_object.bounds(), settings)
        result["files"] = [str(output / f) for f in ("tokens.json", "tokens.md", "tokens.png", "tokens.html")]
    return result
