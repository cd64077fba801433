"""The search setting's registration (``sharpgrpo.settings`` imports this module on the first registry lookup): the
``search_qa`` data set, the ``search_qa`` evaluation task (multi-turn episodes against a retrieval server) and the
prepared model ``sharpgrpo-tiny-search``. Training takes its rollout from ``train.py``'s ``SearchArguments``."""

from sharpgrpo.data import register_dataset
from sharpgrpo.search import evaluation, tiny  # noqa: F401  (their import registers the task and the model)
from sharpgrpo.search.data import search_qa_dataset

register_dataset("search_qa")(search_qa_dataset)
