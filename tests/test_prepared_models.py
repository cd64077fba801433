"""Prepared models by name: the registry that maps ``sharpgrpo-*`` names to cached local builds."""

import pytest

from sharpgrpo.models.prepared import (
    PREPARED_MODELS,
    prepared_model_names,
    register_prepared_model,
    resolve_model_name,
)


def test_builtin_names_are_registered():
    assert {"sharpgrpo-tiny", "sharpgrpo-tiny-search"} <= set(prepared_model_names())


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-3B-Instruct", "./some/local/dir", "sharpgrpo-not-a-model"])
def test_other_names_pass_through_unchanged(name):
    assert resolve_model_name(name) == name


def test_a_registered_builder_gets_the_cache_dir_and_its_result_is_returned(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARPGRPO_CACHE", str(tmp_path))
    seen = []

    @register_prepared_model("sharpgrpo-test-builder")
    def build(cache_dir):
        seen.append(cache_dir)
        return cache_dir / "built"

    try:
        assert resolve_model_name("sharpgrpo-test-builder") == str(tmp_path / "built")
        assert seen == [tmp_path]
        with pytest.raises(ValueError, match="already registered"):
            register_prepared_model("sharpgrpo-test-builder")(build)
    finally:
        PREPARED_MODELS._entries.pop("sharpgrpo-test-builder")


def test_tiny_model_resolves_to_a_loadable_directory():
    from pathlib import Path

    path = Path(resolve_model_name("sharpgrpo-tiny"))
    assert (path / "config.json").is_file()
