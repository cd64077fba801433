"""``search_qa``: the shared search-QA set with Search-R1's prompt (builder in :mod:`sharpgrpo.search.data`)."""

from __future__ import annotations

from sharpgrpo.data import register_dataset
from sharpgrpo.search.data import search_qa_dataset

register_dataset("search_qa")(search_qa_dataset)
