"""Evaluate a checkpoint as the papers do: ``sharpgrpo eval --model PATH_OR_ID --task kk|math|qa ...``.

Examples::

    sharpgrpo eval --model sharpgrpo-tiny --task kk --limit 5 --max_new_tokens 64 --output out/kk.json
    sharpgrpo eval --model Qwen/Qwen2.5-3B-Instruct --task kk --data shared:logicrl --output out/kk.json
    sharpgrpo eval --model runs/grpo_sg/checkpoint-200 --task math --n_samples 16 --output out/math.json
    sharpgrpo eval --model runs/lora --merge --task qa --data nq_test.jsonl --output out/qa.json

Writes the JSON result, a markdown table (``.md``) and the per-problem samples (``.samples.jsonl``, which also lets
an interrupted run resume). The same as ``python -m sharpgrpo eval``; from Python:
``sharpgrpo.evaluation.evaluate(model=..., task=..., output=...)``.
"""

from __future__ import annotations

import sys

from sharpgrpo.evaluation import EvalConfig, evaluate


def main(argv: list[str] | None = None) -> dict:
    from transformers import HfArgumentParser

    from sharpgrpo.run.command_line import CommandParser, unknown_option_error

    class EvalParser(HfArgumentParser):
        error = CommandParser.error  # one line naming the option, not argparse's usage block

    parser = EvalParser(EvalConfig, prog="sharpgrpo eval", description=__doc__.split("\n\n")[0])
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = unknown_option_error(argv, parser._option_string_actions, parser.prog)
    if unknown is not None:
        raise unknown
    (config,) = parser.parse_args_into_dataclasses(args=argv)  # EvalConfig checks every option's value
    result = evaluate(config)
    print(result["markdown"])
    print(f"Wrote {config.output}", file=sys.stderr)
    return result


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # an error prints one line; --debug or SHARPGRPO_DEBUG=1 shows the traceback
        main()
