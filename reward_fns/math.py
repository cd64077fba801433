"""Math reward: 1.0 if the last ``\\boxed{...}`` of the completion is equivalent to the reference under math-verify,
else 0.0 (the binary reward of GRPO-SG App. B.1.1, TR-GRPO and CW-GRPO; docs/methods.md §5).

* The prediction is the content of the last ``\\boxed`` (or ``\\fbox``) in the completion, braces balanced; a missing,
  unclosed or empty box scores 0. It is handed to math-verify as ``\\boxed{content}`` with math-verify's default LaTeX
  normalisation, which repairs malformed LaTeX (``\\boxed{\\frac13}`` is 1/3).
* Golds come in many shapes (raw LaTeX such as ``\\frac12``, zero-padded AIME strings '025', AMC floats 142.0, Minerva
  and OlympiadBench lists, ``$...$``-wrapped strings, ``4.4e7``). :func:`normalize_math_gold` turns any of them into a
  list of LaTeX strings, each an acceptable answer; each is parsed as ``\\boxed{gold}``.
* math-verify's timeouts use ``signal.alarm``, which raises outside the main thread (TRL may run rewards in other
  threads). Parsing and verification therefore run in a persistent worker process (``reward_fns._math_worker``) whose
  main thread keeps math-verify's own timeouts; the caller also waits at most ``watchdog_seconds`` per completion and
  kills and restarts the worker when it hangs (a signal cannot interrupt a long C-level computation). A timeout
  scores 0.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from reward_fns import register_reward
from reward_fns._common import as_list, completion_text, per_completion

CORRECT, WRONG = 1.0, 0.0
BUDGET_BASE_SECONDS = 10.0  # a reward call's time budget: see `reward_call_budget`
BUDGET_SECONDS_PER_COMPLETION = 0.25

# ----------------------------------------------------------------------------------------------------------------
# Extracting the prediction
# ----------------------------------------------------------------------------------------------------------------
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed x``), or None if absent or unclosed."""
    matches = list(_BOX_COMMAND.finditer(text))
    if not matches:
        return None
    position = matches[-1].end()
    if position < len(text) and text[position] == "{":
        depth = 0
        for index in range(position, len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    return text[position + 1 : index]
        return None  # unclosed: the completion was cut off inside its answer
    # "\boxed 5": the token after the space, up to whitespace or a closing "$" (as DeepScaleR's extractor).
    token = re.match(r"\s+([^\s$]+)", text[position:])
    return token.group(1) if token else None


# ----------------------------------------------------------------------------------------------------------------
# Normalising golds
# ----------------------------------------------------------------------------------------------------------------
_ZERO_PADDED_OR_INTEGRAL = re.compile(r"([+-]?)(\d+)(?:\.0*)?")
_SCIENTIFIC = re.compile(r"([+-]?\d+(?:\.\d+)?)[eE]([+-]?)(\d+)")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_LIST_SEPARATOR = re.compile(r"\s*(?:[,;]|and)?\s*")
_DELIMITERS = (("$$", "$$"), ("\\(", "\\)"), ("\\[", "\\]"), ("$", "$"))


def _strip_math_delimiters(text: str) -> str:
    """``$x$`` -> ``x``; ``$69$,$84$`` -> ``69, 84`` (OlympiadBench's multi-answer golds); an odd number of ``$``
    (a broken gold such as ``$221,$8$``) loses them all."""
    if len(_UNESCAPED_DOLLAR.findall(text)) % 2 == 1:
        return _UNESCAPED_DOLLAR.sub("", text).strip()
    for opening, closing in _DELIMITERS:
        if len(text) > len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing):
            inner = text[len(opening) : -len(closing)]
            if opening != "$":
                return inner.strip()
            parts = inner.split("$")
            if len(parts) % 2 == 1 and all(_LIST_SEPARATOR.fullmatch(sep) for sep in parts[1::2]):
                return ", ".join(part.strip() for part in parts[0::2])
    return text


def _unbox(text: str) -> str:
    if text.startswith(("\\boxed{", "\\fbox{")) and text.endswith("}"):
        content = last_boxed_content(text)
        if content is not None and len(content) == len(text) - text.index("{") - 2:
            return content.strip()
    return text


def normalize_latex_number(text: str) -> str:
    """Plain numbers math-verify would misread: '025' -> '25', '142.0' -> '142', '4.4e7' -> '4.4 \\times 10^{7}'."""
    # String operations, not int(): Python refuses to convert integers of more than 4300 digits.
    match = _ZERO_PADDED_OR_INTEGRAL.fullmatch(text)
    if match:
        sign, digits = match.group(1), match.group(2).lstrip("0") or "0"
        return digits if sign == "+" or digits == "0" else sign + digits
    match = _SCIENTIFIC.fullmatch(text)
    if match:
        exponent = match.group(3).lstrip("0") or "0"
        sign = "-" if match.group(2) == "-" and exponent != "0" else ""
        return f"{match.group(1)} \\times 10^{{{sign}{exponent}}}"
    return text


def _normalize_one(gold: Any) -> str:
    if isinstance(gold, float) and math.isfinite(gold) and gold == int(gold):
        return str(int(gold))
    text = repr(gold) if isinstance(gold, float) else str(gold)
    text = _unbox(_strip_math_delimiters(text.strip())).strip()
    return normalize_latex_number(text)


def _flatten(gold: Any) -> list[Any]:
    if gold is None:
        return []
    if hasattr(gold, "tolist") and not isinstance(gold, str):  # numpy arrays and scalars
        gold = gold.tolist()
    if isinstance(gold, (list, tuple, set)):
        return [item for element in gold for item in _flatten(element)]
    return [gold]


def normalize_math_gold(gold: Any) -> list[str]:
    """Acceptable answers as LaTeX strings: a string, a number or a (nested) list of them; empties dropped."""
    answers: list[str] = []
    for item in _flatten(gold):
        try:
            text = _normalize_one(item)
        except Exception:  # an object whose str() fails is no usable gold
            continue
        if text and text not in answers:
            answers.append(text)
    return answers


def gold_to_latex(gold: str) -> str:
    """What math-verify parses for a normalised gold: ``\\boxed{gold}``, or the text itself when it carries its own
    ``$...$`` (a gold mixing prose and math)."""
    return gold if _UNESCAPED_DOLLAR.search(gold) else "\\boxed{" + gold + "}"


# ----------------------------------------------------------------------------------------------------------------
# Verification in a worker process
# ----------------------------------------------------------------------------------------------------------------
_WORKER_PATH = str(Path(__file__).resolve().with_name("_math_worker.py"))


def _stop_process(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        process.stdin.close()
        process.wait(timeout=2)
    except Exception:
        process.kill()
        process.wait()


class MathVerifier:
    """math-verify equivalence checks, safe in any thread, each bounded in time.

    Args:
        parsing_timeout: math-verify's per-parse timeout in the worker, in whole seconds (its default, 5).
        verify_timeout: math-verify's per-comparison timeout in the worker, in whole seconds (its default, 5).
        watchdog_seconds: the longest the caller waits for one completion's verdict; past it the worker is killed,
            the completion scores 0 and the next call starts a fresh worker.
        startup_timeout: the longest to wait for a new worker to import math-verify.
    """

    def __init__(
        self,
        parsing_timeout: int = 5,
        verify_timeout: int = 5,
        watchdog_seconds: float = 30.0,
        startup_timeout: float = 120.0,
    ):
        self.parsing_timeout = parsing_timeout
        self.verify_timeout = verify_timeout
        self.watchdog_seconds = watchdog_seconds
        self.startup_timeout = startup_timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._lines: queue.Queue | None = None
        self._owner_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _stop_process, None)
        self.restarts = 0  # workers started after the first, i.e. after a kill or a crash

    def _start(self) -> None:
        # Run the worker file by path: importing the reward_fns package would also import its parents' heavy
        # dependencies, and dropping "" from sys.path keeps a stray math.py in the working directory out.
        code = (
            "import sys; sys.path[:] = [p for p in sys.path if p]; import runpy; "
            f"runpy.run_path({_WORKER_PATH!r}, run_name='__main__')"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
            start_new_session=True,  # a Ctrl-C meant for training does not hit the worker; it exits on stdin EOF
        )
        lines: queue.Queue = queue.Queue()

        def read_lines() -> None:
            for line in process.stdout:
                lines.put(line)
            lines.put(None)  # EOF: the worker exited

        threading.Thread(target=read_lines, daemon=True, name="math-verify-reader").start()
        try:
            ready = json.loads(lines.get(timeout=self.startup_timeout))
        except (queue.Empty, TypeError, ValueError):  # no line, EOF (None) or not JSON
            ready = None
        if ready != "ready":
            _stop_process(process)
            raise RuntimeError(
                "The math-verify worker process did not start; check that math-verify is installed "
                f"for {sys.executable}."
            )
        if self._process is not None:
            self.restarts += 1
        self._process, self._lines = process, lines
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _stop_process, process)

    def _ensure_worker(self) -> None:
        if self._owner_pid != os.getpid():  # a forked copy must not share the parent's pipes
            self._process, self._lines, self._owner_pid = None, None, os.getpid()
        if self._process is None or self._process.poll() is not None:
            self._start()

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def equivalent(self, prediction: str, golds: list[str], wait_seconds: float | None = None) -> bool:
        """Whether the LaTeX ``prediction`` is equivalent to any of the LaTeX ``golds`` (False on timeout; the caller
        waits at most ``wait_seconds``, ``watchdog_seconds`` by default)."""
        if not prediction.strip() or not golds:
            return False
        request = json.dumps(
            {
                "golds": golds,
                "prediction": prediction,
                "parsing_timeout": self.parsing_timeout,
                "verify_timeout": self.verify_timeout,
            }
        )
        with self._lock:
            self._ensure_worker()
            try:
                self._process.stdin.write(request + "\n")
                self._process.stdin.flush()
                wait = self.watchdog_seconds if wait_seconds is None else min(wait_seconds, self.watchdog_seconds)
                reply = self._lines.get(timeout=max(wait, 0.01))
            except (OSError, queue.Empty):
                reply = None
            try:
                return bool(json.loads(reply)["correct"])
            except Exception:  # hung (None), died, or out of step with the protocol: start afresh next time
                self._kill()
                return False

    def close(self) -> None:
        with self._lock:
            _stop_process(self._process)
            self._process = None


DEFAULT_VERIFIER = MathVerifier()
atexit.register(DEFAULT_VERIFIER.close)


def math_correct(
    completion: Any, answer: Any, verifier: MathVerifier | None = None, wait_seconds: float | None = None
) -> bool:
    """Whether the last ``\\boxed{}`` of ``completion`` (a string or chat messages) matches ``answer`` (any gold
    shape); the check behind math evaluation. ``wait_seconds``: see :meth:`MathVerifier.equivalent`."""
    content = last_boxed_content(completion_text(completion))
    golds = normalize_math_gold(answer)
    if content is None or not content.strip() or not golds:
        return False
    prediction = "\\boxed{" + normalize_latex_number(content.strip()) + "}"
    golds = [gold_to_latex(gold) for gold in golds]
    return (verifier or DEFAULT_VERIFIER).equivalent(prediction, golds, wait_seconds=wait_seconds)


def math_answer_check(prompts, completions, answer, **kwargs) -> list[bool | None]:
    """math-verify equivalence of the last ``\\boxed{}`` with the gold (:func:`math_correct`); None without a gold."""
    completions = as_list(completions)
    golds = per_completion(answer, len(completions))
    return [None if gold is None else math_correct(c, gold) for c, gold in zip(completions, golds, strict=True)]


@register_reward("math", columns=("answer",), answer_check=math_answer_check)
def math_reward(prompts, completions, answer, **kwargs) -> list[float | None]:
    """Binary math reward for TRL: 1.0 if the last ``\\boxed{}`` is math-verify-equivalent to ``answer``, else 0.0.

    ``answer`` is the gold column (a string, number or list of acceptable answers per row). A row whose gold is None
    (another task's sample in a mixed dataset) gets None. Never raises on any completion text.
    """
    completions = as_list(completions)
    golds = per_completion(answer, len(completions))
    deadline = time.monotonic() + reward_call_budget(len(completions))
    rewards: list[float | None] = []
    over_budget = 0
    for completion, gold in zip(completions, golds, strict=True):
        left = deadline - time.monotonic()
        if gold is None:
            rewards.append(None)
        elif left <= 0:  # pathological answers used the call's time: the rest score 0, counted
            over_budget += 1
            rewards.append(WRONG)
        else:
            rewards.append(CORRECT if math_correct(completion, gold, wait_seconds=left) else WRONG)
    log_metric = kwargs.get("log_metric")
    if callable(log_metric):
        log_metric("math/over_time_budget", float(over_budget))
    return rewards


def reward_call_budget(num_completions: int) -> float:
    """Seconds one ``math_reward`` call may spend: :data:`BUDGET_BASE_SECONDS` plus
    :data:`BUDGET_SECONDS_PER_COMPLETION` per completion (a verification normally takes milliseconds; a pathological
    box can take math-verify's 5 s timeouts, and many of them would otherwise stall a step for minutes). Completions
    left when it is spent score 0 and are counted in the ``math/over_time_budget`` metric."""
    return BUDGET_BASE_SECONDS + BUDGET_SECONDS_PER_COMPLETION * num_completions
