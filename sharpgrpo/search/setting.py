"""The search setting's registration (``sharpgrpo.settings`` imports this module on the first registry lookup): the
``search_qa`` data set, the ``search_qa`` evaluation task (multi-turn episodes against a retrieval server) and the
prepared model ``sharpgrpo-tiny-search``; and its training hook: ``SearchArguments`` are parsed by ``train.py``, and
with a retrieval server (``retrieval_url`` or ``retrieval_corpus``) the run's rollout is Search-R1's episodes."""

import contextlib

from sharpgrpo.data import register_dataset
from sharpgrpo.search import evaluation, tiny  # noqa: F401  (their import registers the task and the model)
from sharpgrpo.search.config import SearchArguments
from sharpgrpo.search.data import search_qa_dataset
from sharpgrpo.settings import register_training_setting


@contextlib.contextmanager
def search_training(search_args: SearchArguments, output_dir: str):
    """Yield the search rollout while a retrieval session is up (None when search is off); the run's episode limits
    are written to ``output_dir/search_args.json`` for ``sharpgrpo eval --task search_qa``."""
    if not search_args.enabled:
        yield None
        return
    from accelerate import PartialState

    from sharpgrpo.search.config import save_search_args
    from sharpgrpo.search.session import retrieval_session, search_rollout

    if PartialState().is_main_process:
        save_search_args(search_args, output_dir)
    with retrieval_session(search_args, output_dir, PartialState().local_process_index) as client:
        yield search_rollout(search_args, client)


register_dataset("search_qa")(search_qa_dataset)
register_training_setting(SearchArguments, search_training, reward_fields=("search_turns", "search_calls"))
