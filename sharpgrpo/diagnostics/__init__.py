"""Diagnostics of a training run: training curves and grad-norm variability (``curves``, their figures in
``curve_plots``, the ``sharpgrpo plot`` command), a SAM-style sharpness probe (``sharpness``), and the per-token
probability/weight analysis (``tokens``, ``sharpgrpo tokens``)."""

from sharpgrpo.diagnostics.curves import grad_norm_summary, load_log_history, metric_series, spike_summary
from sharpgrpo.diagnostics.sharpness import SHARPNESS_KEYS, sharpness_probe

__all__ = [
    "SHARPNESS_KEYS",
    "grad_norm_summary",
    "load_log_history",
    "metric_series",
    "sharpness_probe",
    "spike_summary",
]
