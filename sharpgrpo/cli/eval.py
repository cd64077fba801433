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

import dataclasses
import sys

from sharpgrpo.evaluation import EvalConfig, evaluate


def main(argv: list[str] | None = None) -> dict:
    from transformers import HfArgumentParser

    from sharpgrpo.evaluation.tasks import task_argument_classes
    from sharpgrpo.run.command_line import CommandParser, option_names, unknown_option_error

    class EvalParser(HfArgumentParser):
        error = CommandParser.error  # one line naming the option, not argparse's usage block

    # EvalConfig's flags and each registered task's own options (e.g. search_qa's SearchArguments: the declaration
    # train.py parses too). Only the task options given on the command line are passed on: the others keep the
    # task's defaults (search_qa: the evaluated run's own episode limits).
    option_classes = task_argument_classes()
    parser = EvalParser((EvalConfig, *option_classes), prog="sharpgrpo eval", description=__doc__.split("\n\n")[0])
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = unknown_option_error(argv, parser._option_string_actions, parser.prog)
    if unknown is not None:
        raise unknown
    namespace, _ = parser.parse_known_args(args=argv)
    task_fields = {f.name for cls in option_classes for f in dataclasses.fields(cls)}
    given = []  # the task options whose flag occurs in argv (--name value or --name=value)
    for name in option_names(argv):
        action = parser._option_string_actions.get(name)
        if action is not None and action.dest in task_fields and action.dest not in given:
            given.append(action.dest)
    config = EvalConfig(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(EvalConfig)})
    result = evaluate(config, **{name: getattr(namespace, name) for name in given})
    print(result["markdown"])
    print(f"Wrote {config.output}", file=sys.stderr)
    return result


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # an error prints one line; --debug or SHARPGRPO_DEBUG=1 shows the traceback
        main()
