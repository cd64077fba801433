"""Training and evaluation data for the three settings (docs/methods.md §5): K&K logic, math, search QA.

``load_train_dataset(name_or_path, **kwargs)`` is the single entry point configs use:

* a registered name (``DATASETS.names()``): ``kk`` (generated Knights & Knaves puzzles), ``kk_shared`` (the shared K&K
  evaluation files), ``math_eval`` (the shared math evaluation sets), ``addition`` (single-digit sums for a chat
  model); kwargs go to the registered builder;
* otherwise a local ``.jsonl``/``.json``/``.parquet`` file or folder, or a Hugging Face Hub id (DeepScaleR, ORZ,
  open-rs, NQ/HotpotQA, ...), read with ``datasets.load_dataset`` and shaped by ``column_mapping``/``prompt_template``
  (see :func:`sharpgrpo.data.loading.load_dataset_source`).

Every returned dataset has a ``prompt`` column (a string, or a list of chat messages, as TRL accepts) and the columns
its reward function reads (``solution_text_format`` for ``kk``, ``answer`` for ``math``, ``golden_answers`` for
``qa_em``).
"""

from __future__ import annotations

from sharpgrpo.data.registry import DATASETS, register_dataset

__all__ = ["DATASETS", "load_train_dataset", "register_dataset"]


def load_train_dataset(name_or_path: str, **kwargs):
    """A ``datasets.Dataset`` with a ``prompt`` column, from a registered name, a local path or a hub id.

    A registered name calls its builder with ``kwargs``. Anything else is passed to
    :func:`sharpgrpo.data.loading.load_dataset_source`, whose keyword arguments are ``column_mapping`` (dict
    source column -> target column; a dotted source such as ``"reward_model.ground_truth"`` reads a nested field),
    ``prompt_template`` (e.g. ``"math"`` or ``"{question}"``), ``conversational``, ``split``, ``subset`` and
    ``max_samples``.
    """
    if name_or_path in DATASETS:
        return DATASETS.get(name_or_path)(**kwargs)
    from sharpgrpo.data.loading import load_dataset_source

    return load_dataset_source(name_or_path, **kwargs)


# Importing the submodules registers their datasets.
import sharpgrpo.data.addition  # noqa: E402,F401
import sharpgrpo.data.kk  # noqa: E402,F401
import sharpgrpo.data.math  # noqa: E402,F401
