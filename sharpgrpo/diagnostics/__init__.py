"""Diagnostics of a training run: training curves and grad-norm variability (``curves``, their figures in
``curve_plots``, the ``sharpgrpo plot`` command) and the per-token probability/weight analysis (``tokens``,
``sharpgrpo tokens``). The sharpness probe that runs inside training is ``sharpgrpo.training.loss.sharpness``."""

from sharpgrpo.diagnostics.curves import grad_norm_summary, load_log_history, metric_series, spike_summary

__all__ = ["grad_norm_summary", "load_log_history", "metric_series", "spike_summary"]
