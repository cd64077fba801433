"""Per-token weights and advantage factors of a run's completions: ``sharpgrpo tokens --model M --output DIR ...``.

    sharpgrpo tokens --model RUN_DIR --completions RUN_DIR/completions --output DIR
    sharpgrpo tokens --model sharpgrpo-tiny --prompts prompts.jsonl --output DIR

Writes ``tokens.json``, ``tokens.md``, ``tokens.png`` and the self-contained page ``tokens.html``. A token-weight
strategy gets GRPO-SG App. C.3's token table and each token shaded by its weight (``sharpgrpo.diagnostics.tokens``);
an advantage strategy each token's factor A[i,t] / A[i] on whole groups of the run's saved completions
(``sharpgrpo.diagnostics.advantage_tokens``). The same as ``python -m sharpgrpo tokens``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sharpgrpo.diagnostics.tokens import (
    analyze_tokens,
    read_logged_rows,
    read_prompts,
    run_settings,
    saved_training_args,
    tokens_markdown,
)


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"Expected KEY=VALUE, got {text!r}.")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _is_weight_strategy(name: str) -> bool:
    from sharpgrpo.strategies import STRATEGIES

    return name in STRATEGIES and STRATEGIES.get(name).kind == "weight"


def _check_options(args) -> None:
    """What the options name, before any file is read or model loaded: the model (folder files, prepared name or Hub
    id), the input paths, the strategy and every --set field."""
    import dataclasses
    import difflib

    from sharpgrpo import SharpGRPOConfig
    from sharpgrpo.command_line import check_input_path
    from sharpgrpo.models.source import check_model_source
    from sharpgrpo.strategies import STRATEGIES
    from sharpgrpo.validation import ConfigError

    check_model_source(args.model, field="--model")
    if args.completions is not None:
        check_input_path("--completions", args.completions, "exists")
    if args.prompts is not None:
        check_input_path("--prompts", args.prompts, "file")
    if args.strategy is not None and args.strategy not in STRATEGIES:
        raise ConfigError(f"--strategy={args.strategy!r}: no such strategy; choose one of {', '.join(STRATEGIES.names())}.")
    fields = [f.name for f in dataclasses.fields(SharpGRPOConfig)]
    for key, value in args.overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            raise ConfigError(f"--set {key}={value}: {key} is not a SharpGRPOConfig field"
                              + (f" (did you mean {close[0]}?)." if close else "."))  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from sharpgrpo.command_line import CommandParser, check_output_folder
    from sharpgrpo.evaluation.models import load_model_and_tokenizer
    from sharpgrpo.validation import integer, positive

    parser = CommandParser(prog="sharpgrpo tokens", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="sharpgrpo-tiny, a model/adapter directory or a hub id.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--completions", help="TRL's completions folder (or one completions_<step>.parquet file).")
    source.add_argument("--prompts", help="Prompts to sample from: .jsonl with a 'prompt' field, or one per line.")
    parser.add_argument(
        "--output", required=True, help="Folder for tokens.json, tokens.md, tokens.png and tokens.html."
    )
    parser.add_argument(
        "--strategy", default=None,
        help="A token-weight strategy (grpo_sg, reverse, random, equal): the token table and each token shaded by "
        "its weight; an advantage strategy (thr, nthr, cw_grpo, ar, passk_mixed; needs --completions): each token "
        "shaded by its factor A[i,t] / A[i] (sharpgrpo.diagnostics.advantage_tokens). Default: the run's own "
        "strategies (its training_args.json beside the model or the completions; with an advantage strategy among "
        "them, its factors, the weight strategy's weights as an underline), else grpo_sg.",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", type=_parse_override, default=[], metavar="KEY=VALUE",
        help="SharpGRPOConfig field, e.g. --set sg_tau=0.2 (repeatable). Default: the run's own temperature and "
        "sg_*/random_weight_* values (its training_args.json), else the config defaults.",
    )  # fmt: skip
    parser.add_argument(
        "--temperature", type=float, default=None, rule=positive(allow_none=True),
        help="Logit temperature (default: the run's, else the config's).",
    )  # fmt: skip
    parser.add_argument("--num_samples", type=int, default=4, rule=integer(1), help="Samples per prompt (with --prompts).")
    parser.add_argument("--max_new_tokens", type=int, default=256, rule=integer(1), help="Sample length (with --prompts).")
    parser.add_argument("--max_rows", type=int, default=None, rule=integer(1, allow_none=True),
                        help="Analyse at most this many logged completions.")  # fmt: skip
    parser.add_argument("--top", type=int, default=100, rule=integer(1), help="Tokens per table (the paper: 100).")
    parser.add_argument("--chart_top", type=int, default=25, rule=integer(1), help="Tokens per bar-chart panel.")
    parser.add_argument("--min_count", type=int, default=5, rule=integer(1),
                        help="Rank only tokens seen at least this often.")  # fmt: skip
    parser.add_argument("--batch_size", type=int, default=8, rule=integer(1))
    parser.add_argument("--apply_chat_template", action="store_true", help="Wrap string prompts as a user message.")
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=0, rule=integer(0))
    args = parser.parse_args(argv)
    _check_options(args)
    check_output_folder("--output", args.output)
    scores = None
    if args.completions:  # read (or fail on) the inputs before the model loads
        prompts, completions, scores = read_logged_rows(args.completions, args.max_rows)
    else:
        prompts, completions = read_prompts(args.prompts), None
    settings, run_strategies, settings_file = run_settings(args.completions, args.model)
    requested = [args.strategy] if args.strategy else run_strategies
    if any(not _is_weight_strategy(s) for s in requested):  # an advantage strategy: its factors on whole groups
        return _advantage_main(args, prompts, completions, scores, requested)
    strategy = args.strategy or next((s for s in run_strategies if _is_weight_strategy(s)), None) or "grpo_sg"
    if settings_file is not None:
        used = ", ".join(f"{k}={v}" for k, v in settings.items())
        print(f"[sharpgrpo] the run's settings from {settings_file}: {used}, {strategy=} (flags override them)")
    overrides = {**settings, **dict(args.overrides)}
    run_temperature = overrides.pop("temperature", None)  # analyze_tokens' own argument
    temperature = run_temperature if args.temperature is None else args.temperature
    model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    result = analyze_tokens(
        model, tokenizer, prompts, completions, strategy=strategy, temperature=temperature, scores=scores,
        num_samples=args.num_samples, max_new_tokens=args.max_new_tokens, top=args.top, min_count=args.min_count,
        batch_size=args.batch_size, apply_chat_template=args.apply_chat_template, output=args.output,
        chart_top=args.chart_top, seed=args.seed, **overrides,
    )  # fmt: skip
    print(tokens_markdown({"high": result["high"], "low": result["low"]}, result["strategy"], result["overall"]))
    return result


def _advantage_main(args, prompts, completions, scores, strategies: list[str]) -> dict[str, Any]:
    """The command line for advantage strategies: factors A[i,t] / A[i] on the run's saved completions."""
    from sharpgrpo.diagnostics.advantage_tokens import analyze_advantage_tokens, factor_markdown
    from sharpgrpo.evaluation.models import load_model_and_tokenizer
    from sharpgrpo.strategies import STRATEGIES

    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        STRATEGIES.get(unknown[0])  # the registry's error lists the valid names
    if not args.completions:
        raise ValueError(
            f"{strategies} holds advantage strategies: their factors need whole groups with their rewards, i.e. a "
            "run's saved completions (--completions), not --prompts."
        )
    saved, settings_file = saved_training_args(args.completions, args.model)
    weight = next((s for s in strategies if _is_weight_strategy(s)), None)
    if settings_file is not None:
        print(f"[sharpgrpo] the run's settings from {settings_file}: strategies {strategies} (flags override them)")
    if args.max_rows is not None:  # whole groups only
        generations = int(dict(args.overrides).get("num_generations", saved.get("num_generations", 8)))
        keep = len(prompts) - len(prompts) % generations
        prompts, completions, scores = prompts[:keep], completions[:keep], scores[:keep]
    model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    result = analyze_advantage_tokens(
        model, tokenizer, prompts, completions, scores, strategies, saved, temperature=args.temperature,
        batch_size=args.batch_size, apply_chat_template=args.apply_chat_template, weight_strategy=weight,
        output=args.output, **dict(args.overrides),
    )  # fmt: skip
    print(factor_markdown(result))
    return result


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # one line per error; --debug or SHARPGRPO_DEBUG=1 for the traceback
        main()
