"""The agentic search setting (GRPO-SG's third; Search-R1 format; docs/search.md).

* :mod:`~sharpgrpo.search.config`: ``SearchArguments`` (retrieval server, episode limits), parsed by ``train.py``;
* :mod:`~sharpgrpo.search.format`: Search-R1's prompt, turn actions, retry message and passage formatting;
* :mod:`~sharpgrpo.search.rollout`: multi-turn episodes with ``env_mask`` for TRL's ``rollout_func``;
* :mod:`~sharpgrpo.search.client` / :mod:`~sharpgrpo.search.server` / :mod:`~sharpgrpo.search.session`: the
  ``/retrieve`` API (Search-R1's), a BM25 server over a local corpus, and the server a run uses;
* :mod:`~sharpgrpo.search.data`: the shared search-QA set (``search_qa``); :mod:`~sharpgrpo.search.tiny`: the tiny
  offline search model (``sharpgrpo-tiny-search``); :mod:`~sharpgrpo.search.evaluation`: ``--task search_qa``;
* :mod:`~sharpgrpo.search.setting`: the registration of the above (``sharpgrpo.settings`` imports it).
"""

from sharpgrpo.search.config import SearchArguments

__all__ = ["SearchArguments"]
