"""The tiny search model (random weights: tests drive its behaviour), built once per session."""

import pytest


@pytest.fixture(scope="session")
def search_model_path(tmp_path_factory):
    from sharpgrpo.search.tiny import build_tiny_search_model

    return str(build_tiny_search_model(tmp_path_factory.mktemp("tiny-search") / "m", warm_start_steps=0))
