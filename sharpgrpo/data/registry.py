"""The dataset registry (``load_train_dataset``'s registered names); settings (``sharpgrpo.settings``) register
theirs on the first lookup."""

from __future__ import annotations

from sharpgrpo.registry import Registry
from sharpgrpo.settings import load_settings

DATASETS = Registry("dataset", load=load_settings)
register_dataset = DATASETS.register
