"""``sharpgrpo record RUN [OTHER]``: print a run's record, or what differs between two runs' records.

    sharpgrpo record runs/demo                       # the record of a run folder (train, compare, tokens, plot)
    sharpgrpo record out/kk.json                     # an evaluation's (out/kk.run_record.json)
    sharpgrpo record runs/seed0 runs/seed1           # every field that differs: config, versions, commit, machine

A record (``run_record.json``, `sharpgrpo.run.run_record`) holds the resolved config, the command line, the library
versions, the code's commit, the machine's accelerator and CPU kernel capability, the seeds and the process count.
With two runs, each differing field is printed as ``field: first -> second`` (``created`` aside); the exit status is 0
either way.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from sharpgrpo.run.command_line import CommandParser
    from sharpgrpo.run.run_record import read_run_record, record_differences

    parser = CommandParser(prog="sharpgrpo record", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", path="exists", help="A run folder, an evaluation's result (x.json) or a record file.")
    parser.add_argument("other", nargs="?", default=None, path="exists",
                        help="A second run: print the fields whose values differ instead.")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        first = read_run_record(args.run)
        second = read_run_record(args.other) if args.other is not None else None
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    if second is None:
        print(json.dumps(first, indent=2))
        return {"record": first}
    differences = record_differences(first, second)
    if not differences:
        print(f"{args.run} and {args.other}: the records agree in every field (created aside).")
    else:
        print(f"{len(differences)} field(s) differ ({args.run} -> {args.other}):")
        for field, left, right in differences:
            print(f"  {field}: {json.dumps(left)} -> {json.dumps(right)}")
    return {"records": [first, second], "differences": differences}


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # one line per error; --debug or SHARPGRPO_DEBUG=1 for the traceback
        main()
