"""Per-token weights and advantages of a run: ``sharpgrpo tokens --telemetry RUN_DIR --output DIR ...``.

    sharpgrpo tokens --telemetry RUN_DIR --output DIR [--step N --group G --shade COLUMN --filter clipped]
    sharpgrpo tokens --telemetry RUN_A --compare RUN_B --step 1 --output DIR
    sharpgrpo tokens --telemetry RUN_DIR --what-if rollout_rs=token_k3 --what-if rollout_rs_threshold=0.01 --output DIR
    sharpgrpo tokens --model RUN_DIR --completions RUN_DIR/completions --output DIR
    sharpgrpo tokens --model sharpgrpo-tiny --prompts prompts.jsonl --output DIR

``--telemetry`` reads the run's per-token telemetry (``token_telemetry: true``), no model: ``tokens.html`` (each token
shaded by any column, filters, one step and group, two runs or steps side by side), ``telemetry.png`` and
``tokens.json`` (``sharpgrpo.diagnostics.telemetry``); it works for every strategy, a user-registered one included.
``--what-if`` on a vLLM run's telemetry: which tokens another rollout-correction setting would have dropped, and
their weights, recomputed from the file (``sharpgrpo.diagnostics.correction_what_if``).
``--model`` with ``--completions``/``--prompts`` is GRPO-SG App. C.3's token table of a token-weight strategy on a
model (``sharpgrpo.diagnostics.tokens``): ``tokens.json``, ``tokens.md``, ``tokens.png`` and ``tokens.html``. The
same as ``python -m sharpgrpo tokens``.
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


def _weight_strategy_names() -> list[str]:
    from sharpgrpo.strategies import STRATEGIES

    return [name for name in STRATEGIES.names() if _is_weight_strategy(name)]


def _check_options(args) -> None:
    """What the options name, before any file is read or model loaded: the input paths, the strategy and every --set
    field (the model is checked once its inputs have been read, before it loads)."""
    import dataclasses
    import difflib

    from sharpgrpo import SharpGRPOConfig
    from sharpgrpo.run.command_line import check_input_path
    from sharpgrpo.strategies import STRATEGIES
    from sharpgrpo.validation import ConfigError

    if args.what_if and (args.telemetry is None or args.compare is not None or args.compare_step is not None):
        raise ConfigError("--what-if: only with --telemetry, on one run's step (not with --compare/--compare_step).")
    if args.telemetry is not None:  # no model: the run's files
        check_input_path("--telemetry", args.telemetry, "exists")
        if args.compare is not None:
            check_input_path("--compare", args.compare, "exists")
        _check_what_if(args.what_if)
        return
    if args.model is None:
        raise ConfigError("--model: required with --completions or --prompts (the model whose probabilities are shown).")
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


def _check_what_if(changes: list[str]) -> None:
    """Each ``--what-if`` is KEY=VALUE with KEY a rollout-correction field (the values are checked with the run's
    setting, once the file is read)."""
    from sharpgrpo.diagnostics.correction_what_if import WhatIfError, correction_fields, parse_change
    from sharpgrpo.validation import did_you_mean

    for text in changes:
        key, value = parse_change(text)
        if key not in correction_fields():
            raise WhatIfError(f"--what-if {key}={value}: {key} is not a rollout-correction field"
                              f"{did_you_mean(key, correction_fields())}; the fields are "
                              f"{', '.join(correction_fields())}.")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from sharpgrpo.evaluation.models import load_model_and_tokenizer
    from sharpgrpo.models.source import check_model_source
    from sharpgrpo.run.command_line import CommandParser, check_output_folder
    from sharpgrpo.validation import integer, positive

    parser = CommandParser(prog="sharpgrpo tokens", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="sharpgrpo-tiny, a model/adapter directory or a hub id (not with --telemetry).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--telemetry", help="A run's per-token telemetry (token_telemetry: true): the run folder, its telemetry/ "
        "folder or one telemetry_<step>.parquet. No model: the page shows the very values the loss used.",
    )  # fmt: skip
    source.add_argument("--completions", help="TRL's completions folder (or one completions_<step>.parquet file).")
    source.add_argument("--prompts", help="Prompts to sample from: .jsonl with a 'prompt' field, or one per line.")
    parser.add_argument(
        "--output", required=True, help="Folder for tokens.json, tokens.md, tokens.png and tokens.html."
    )
    parser.add_argument(
        "--strategy", default=None,
        help=f"A token-weight strategy ({', '.join(_weight_strategy_names())}): the token table and each token shaded by "
        "its weight. Default: the run's own weight strategy (its training_args.json beside the model or the "
        "completions), else grpo_sg. Advantage strategies: --telemetry.",
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
    view = parser.add_argument_group("telemetry page (--telemetry)")
    view.add_argument("--step", type=int, default=None, help="The telemetry step to show (default: the last).")
    view.add_argument("--group", action="append", default=[], help="Group(s) (prompt_index) to show, e.g. 0,3.")
    view.add_argument("--shade", default=None, help="Column shading each token: weight, factor (A[i,t]/A[i]), "
                      "advantage, advantage/<strategy>, p, ratio, entropy, token_loss, loss_contribution, ... "
                      "(default: weight with a weight strategy, else factor with an advantage strategy).")
    view.add_argument("--filter", choices=("clipped", "masked", "zero_weight"), default=None,
                      help="Outline these tokens and show only the completions holding one.")
    view.add_argument("--compare", default=None, help="Another run's telemetry, side by side on the same prompts "
                      "(two strategies with the same seed generate the same first batch: use --step 1).")
    view.add_argument("--compare_step", type=int, default=None, help="Compare with this step (of --compare, or of "
                      "the same run).")
    view.add_argument("--max_groups", type=int, default=8, help="Groups shown when --group is not given.")
    view.add_argument(
        "--what-if", dest="what_if", action="append", default=[], metavar="KEY=VALUE",
        help="A rollout-correction field with another value, e.g. --what-if rollout_rs=token_k3 --what-if "
        "rollout_rs_threshold=0.01 (repeatable; a vLLM run's telemetry): the tokens it would drop, recomputed from "
        "the file's old_logp and sampling_logp; the page is shaded by what_if/change (+1 dropped only under it, -1 "
        "only under the run's setting) unless --shade says otherwise.",
    )  # fmt: skip
    args = parser.parse_args(argv)
    _check_options(args)
    for label, value, rule in (("--step", args.step, integer(0, allow_none=True)),
                               ("--compare_step", args.compare_step, integer(0, allow_none=True)),
                               ("--max_groups", args.max_groups, integer(1))):
        rule.check(label, value)
    check_output_folder("--output", args.output, command=parser.prog)  # run.output_dir: the rule of every writer
    if args.telemetry:
        return _telemetry_main(args, argv)
    scores = None
    if args.completions:  # read (or fail on) the inputs before the model loads
        prompts, completions, scores = read_logged_rows(args.completions, args.max_rows)
    else:
        prompts, completions = read_prompts(args.prompts), None
    check_model_source(args.model, field="--model")  # its folder's files, a prepared name or a Hub id
    settings, run_strategies, settings_file = run_settings(args.completions, args.model)
    requested = [args.strategy] if args.strategy else run_strategies
    if any(not _is_weight_strategy(s) for s in requested):  # an advantage strategy: what the loss used, exported
        raise ValueError(
            f"strategies {requested} hold an advantage strategy: its token advantages are read from the run's "
            "per-token telemetry (train with `token_telemetry: true`, then `sharpgrpo tokens --telemetry RUN_DIR`)."
        )
    strategy = args.strategy or next((s for s in run_strategies if _is_weight_strategy(s)), None) or "grpo_sg"
    if settings_file is not None:
        used = ", ".join(f"{k}={v}" for k, v in settings.items())
        print(f"[sharpgrpo] the run's settings from {settings_file}: {used}, {strategy=} (flags override them)")
    overrides = {**settings, **dict(args.overrides)}
    run_temperature = overrides.pop("temperature", None)  # analyze_tokens' own argument
    temperature = run_temperature if args.temperature is None else args.temperature
    from sharpgrpo.run.output_dir import claim_output_target

    claim_output_target(args.output, command="sharpgrpo tokens", config=vars(args), argv=argv)  # inputs checked
    model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    result = analyze_tokens(
        model, tokenizer, prompts, completions, strategy=strategy, temperature=temperature, scores=scores,
        num_samples=args.num_samples, max_new_tokens=args.max_new_tokens, top=args.top, min_count=args.min_count,
        batch_size=args.batch_size, apply_chat_template=args.apply_chat_template, output=args.output,
        chart_top=args.chart_top, seed=args.seed, **overrides,
    )  # fmt: skip
    print(tokens_markdown({"high": result["high"], "low": result["low"]}, result["strategy"], result["overall"]))
    return result


def _telemetry_main(args, argv: list[str] | None) -> dict[str, Any]:
    """The page of a run's per-token telemetry: no model, no forward (``sharpgrpo.diagnostics.telemetry``)."""
    from pathlib import Path

    from sharpgrpo.diagnostics.telemetry import (
        plot_telemetry,
        read_telemetry,
        select_tokens,
        summary,
        telemetry_files,
        token_ranking,
        write_telemetry_page,
    )

    def pick(path: str, step: int | None):
        files = telemetry_files(path)
        if step is None:
            step = max(files)
        if step not in files:
            raise ValueError(f"--step {step}: {path} has telemetry for steps {', '.join(map(str, sorted(files)))}")
        frame, meta = read_telemetry(files[step])  # refused when it is another run's than the folder it sits in
        if meta.get("run_folder") is None:
            import sys

            print(f"[sharpgrpo] {files[step]} is not inside a run folder (RUN/telemetry/ with "
                  "RUN/training_args.json): its schema and step are checked, which run it belongs to is not (its "
                  f"metadata says output_dir={meta.get('output_dir')}, strategies={meta.get('strategies')}, "
                  f"seed={meta.get('seed')})", file=sys.stderr)
        return step, frame, meta, files[step]

    groups = [int(g) for text in args.group for g in str(text).split(",") if g != ""]
    step, frame, meta, file = pick(args.telemetry, args.step)
    changed = None  # the what-if's summary
    if args.what_if:  # another correction setting, recomputed from the file's own log-probabilities
        from sharpgrpo.diagnostics.correction_what_if import parse_change, summary_html, summary_line, what_if

        frame, changed = what_if(frame, meta, [parse_change(text) for text in args.what_if])
    runs = [(f"{Path(meta.get('output_dir') or args.telemetry).name or args.telemetry} step {step}", frame, meta)]
    if args.compare is not None or args.compare_step is not None:
        other = args.compare or args.telemetry
        other_step, other_frame, other_meta, _ = pick(other, args.compare_step if args.compare_step is not None
                                                      else (step if args.compare else None))
        label = f"{Path(other_meta.get('output_dir') or other).name or other} step {other_step}"
        runs.append((label if label != runs[0][0] else label + " (compared)", other_frame, other_meta))
    # each run shaded by its own strategy's column (weight for a weight strategy, factor for an advantage one)
    columns = [args.shade] * len(runs) if args.shade else [_default_column(m, f) for _, f, m in runs]
    if changed is not None and not args.shade:
        columns = ["what_if/change"]
    column = columns[0]
    selected = [(label, select_tokens(f, groups=groups or None, token_filter=args.filter,
                                      max_groups=None if groups else args.max_groups), m) for label, f, m in runs]
    from sharpgrpo.run.output_dir import claim_output_target

    output = claim_output_target(args.output, command="sharpgrpo tokens", config=vars(args), argv=argv)  # inputs read
    page = write_telemetry_page(output / "tokens.html", selected, columns, args.filter,
                                notes=summary_html(changed) if changed is not None else "")
    if all(len(f) == 0 for _, f, _ in selected):
        import sys

        what = f"matches --filter {args.filter}" if args.filter else "is in the groups picked"
        print(f"[sharpgrpo] no token of step {step} {what}; {page} says so and shows nothing else.", file=sys.stderr)
    figure = plot_telemetry(frame, output / "telemetry.png", f"{runs[0][0]}: {', '.join(meta['strategies'])}")
    result = {
        "file": str(file), "step": step, "column": column, "columns": columns, "filter": args.filter,
        "page": str(page),
        "figure": str(figure), "metadata": {k: v for k, v in meta.items() if k != "columns"},
        "summary": {label: summary(f) for label, f, _ in runs},
        "shown": {label: summary(f) for label, f, _ in selected},
    }
    if changed is not None:
        result["what_if"] = changed
        print(summary_line(changed))
    ranking, overall = token_ranking(frame, args.top, args.min_count)  # GRPO-SG App. C.3's table, as trained
    (output / "tokens.md").write_text(tokens_markdown(ranking, " x ".join(meta["strategies"]), overall))
    result.update(ranking, overall=overall)
    (output / "tokens.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"[sharpgrpo] {page} ({', '.join(dict.fromkeys(columns))}), {figure}: step {step} of {file}")
    return result


def _default_column(meta: dict[str, Any], frame) -> str:
    """``weight`` with a weight strategy, else ``factor`` (A[i,t] / A[i]) with an advantage strategy, else
    ``advantage``."""
    if any(c.startswith("weight/") for c in frame.columns):
        return "weight"
    if any(c.startswith("advantage/") for c in frame.columns):
        return "factor"
    return "advantage"


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # one line per error; --debug or SHARPGRPO_DEBUG=1 for the traceback
        main()
