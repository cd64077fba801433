"""The strict-letters task: the demo's prompts, judged all-or-nothing.

The prompt is the demo's (``letters: a b c\\nword:``, so the tiny model's warm start applies unchanged); a
completion is correct when its first ``STRICT_WORD_LENGTH`` non-space characters exist and are all allowed, and the
reward is 1 for a correct completion and 0 otherwise. The warm-started model draws an allowed letter with
probability about 0.6, so it starts near 0.05 correct and GRPO must raise every letter's probability at
once: with a binary reward THR (its positive set is the correct completions), NTHR and Pass@K-mixed apply, and
there is room for strategies to differ within a few hundred CPU steps.
"""

from __future__ import annotations

import itertools

from sharpgrpo.data.demo import DEMO_LETTERS, demo_dataset, demo_prompt
from sharpgrpo.evaluation.report import markdown_table, percent
from sharpgrpo.validation import argument_rules, integer

STRICT_WORD_LENGTH = 5


def _text(completion) -> str:
    if isinstance(completion, list):  # conversational: the last message's content
        return completion[-1]["content"] if completion else ""
    return completion


def strict_letters_correct(prompts, completions, allowed, **kwargs) -> list[bool]:
    """Whether the first ``STRICT_WORD_LENGTH`` non-space characters of each completion exist and are allowed."""
    checks = []
    for completion, letters in zip(completions, allowed, strict=True):
        characters = "".join(_text(completion).split())[:STRICT_WORD_LENGTH]
        checks.append(len(characters) == STRICT_WORD_LENGTH and all(c in letters for c in characters))
    return checks


def strict_letters_reward(prompts, completions, allowed, **kwargs) -> list[float]:
    """Binary correctness: 1.0 for a completion :func:`strict_letters_correct` accepts, else 0.0."""
    return [float(ok) for ok in strict_letters_correct(prompts, completions, allowed)]


@argument_rules(num_prompts=integer(1), seed=integer(0))
def strict_letters_dataset(num_prompts: int = 512, seed: int = 0):
    """The demo's dataset (``prompt`` and ``allowed`` columns, every 3-letter subset of a-h, shuffled, cycled)."""
    return demo_dataset(num_prompts=num_prompts, seed=seed)


def register_strict_letters() -> None:
    """Register dataset ``strict_letters``, reward ``strict_letters`` and evaluation task ``strict_letters``
    (idempotent)."""
    from reward_fns import REWARD_FUNCTIONS, register_reward
    from sharpgrpo.data import DATASETS

    if "strict_letters" not in DATASETS:
        DATASETS.register("strict_letters")(strict_letters_dataset)
    if "strict_letters" not in REWARD_FUNCTIONS:
        register_reward("strict_letters", columns=("allowed",), answer_check=strict_letters_correct)(
            strict_letters_reward
        )
    register_strict_letters_eval()


def register_strict_letters_eval() -> None:
    """Register evaluation task ``strict_letters`` for ``sharpgrpo eval`` (idempotent)."""
    from sharpgrpo.evaluation.tasks import EVAL_TASKS, EvalTask, Problem, group_metrics, records_by_group

    if "strict_letters" in EVAL_TASKS:
        return

    @EVAL_TASKS.register("strict_letters")
    class StrictLettersTask(EvalTask):
        """Every 3-letter subset of a-h once decoded greedily (group ``greedy``: accuracy) and once sampled
        ``n_samples`` times (group ``sampled``: avg@n and pass@k); ``limit`` caps the subsets."""

        name = "strict_letters"
        default_max_new_tokens = 16  # a short word; strict_letters_cpu trains with 8

        def load_problems(self, config):
            subsets = ["".join(c) for c in itertools.combinations(DEMO_LETTERS, 3)]
            problems = []
            for group, sampled in (("greedy", False), ("sampled", config.n_samples > 1)):
                problems += [
                    Problem(id=f"{group}/{a}", group=group, prompt=demo_prompt(a), reference={"allowed": a},
                            sampled=sampled)
                    for a in subsets[: config.limit]
                ]  # fmt: skip
            return problems

        def score(self, problems, completions):
            return [
                strict_letters_correct(None, list(texts), [p.reference["allowed"]] * len(texts))
                for p, texts in zip(problems, completions, strict=True)
            ]

        def summarize(self, records):
            groups = {g: group_metrics(r) for g, r in records_by_group(records).items()}
            overall = dict(groups["greedy"])
            if "pass@k" in groups.get("sampled", {}):
                overall["pass@k"] = groups["sampled"]["pass@k"]
                overall[f"avg@{groups['sampled']['samples']}"] = groups["sampled"]["accuracy"]
            return {"overall": overall, "groups": groups}

        def markdown(self, summary, label):
            overall = summary["overall"]
            headers = ["Model", "Greedy accuracy"] + [f"pass@{k}" for k in overall.get("pass@k", {})]
            row = [label, percent(overall["accuracy"])] + [percent(v) for v in overall.get("pass@k", {}).values()]
            return "Strict letters (first 5 letters all allowed).\n\n" + markdown_table(headers, [row])
