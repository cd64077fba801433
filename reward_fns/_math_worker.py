"""Worker process behind ``reward_fns.math``: runs math-verify in its own main thread.

math-verify bounds parsing and comparison with ``signal.alarm``, which only works in the main thread of the main
interpreter; TRL may call reward functions from other threads (e.g. its async reward loop). Running math-verify here,
in a child process's main thread, keeps its own timeouts working, and the parent kills this process when even those
do not return in time (a signal cannot interrupt a long C-level computation such as a huge integer power).

Protocol: one JSON object per line on stdin, ``{"golds": [latex, ...], "prediction": latex, "parsing_timeout": s,
"verify_timeout": s}``; one line ``{"correct": bool}`` per request on stdout, after a first line ``"ready"``.
"""

from __future__ import annotations

import json
import logging
import os
import sys


def main() -> None:
    # Replies go to the original stdout; anything a library prints goes to stderr and cannot break the protocol.
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    # Timeouts and parse failures are expected on model output; they score 0 and need no log line each.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    # Boxed content first; the default normalisation repairs malformed LaTeX (\frac13 -> \frac{1}{3}).
    latex = [LatexExtractionConfig(boxed_match_priority=0)]
    latex_or_expr = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    parsed_golds: dict[str, list] = {}

    def parse_gold(gold: str, timeout: int) -> list:
        # The G completions of a group share their gold: parse it once (a failed or timed-out parse is retried).
        if gold not in parsed_golds:
            parsed = parse(gold, latex_or_expr, parsing_timeout=timeout)
            if not parsed:
                return parsed
            if len(parsed_golds) >= 4096:
                parsed_golds.clear()
            parsed_golds[gold] = parsed
        return parsed_golds[gold]

    def is_correct(request: dict) -> bool:
        parsing_timeout = int(request.get("parsing_timeout", 5))
        verify_timeout = int(request.get("verify_timeout", 5))
        prediction = parse(request["prediction"], latex, parsing_timeout=parsing_timeout)
        if not prediction:
            return False
        for gold in request["golds"]:
            parsed_gold = parse_gold(gold, parsing_timeout)
            if parsed_gold and verify(parsed_gold, prediction, timeout_seconds=verify_timeout):
                return True
        return False

    print(json.dumps("ready"), file=replies, flush=True)
    for line in sys.stdin:
        try:
            correct = is_correct(json.loads(line))
        except (Exception, TimeoutException):  # TimeoutException derives from BaseException
            correct = False
        print(json.dumps({"correct": bool(correct)}), file=replies, flush=True)


if __name__ == "__main__":
    main()
