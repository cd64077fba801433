"""Evaluation the way the papers report it (docs/methods.md §5): K&K accuracy per number of people, math greedy accuracy
and avg@k / pass@k, QA exact match. Command line: ``sharpgrpo eval``; Python: :func:`evaluate`."""

from sharpgrpo.evaluation.metrics import avg_at_k, mean_avg_at_k, mean_pass_at_k, pass_at_k, pass_k_values
from sharpgrpo.evaluation.runner import EvalConfig, evaluate, output_paths
from sharpgrpo.evaluation.tasks import EVAL_TASKS

__all__ = [
    "EVAL_TASKS",
    "EvalConfig",
    "avg_at_k",
    "evaluate",
    "mean_avg_at_k",
    "mean_pass_at_k",
    "output_paths",
    "pass_at_k",
    "pass_k_values",
]
