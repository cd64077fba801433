"""A model folder is checked before anything loads (``sharpgrpo.models.source.model_folder_problem``): its config,
its weights (every shard its index lists) and its tokenizer, or for a LoRA adapter its config, base model and
weights. A folder missing one is refused in one line naming the folder and the file, and ``train.py`` then writes
nothing into ``output_dir``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sharpgrpo.models.source import check_model_source
from sharpgrpo.validation import ConfigError


def broken_copy(source: str, target: Path, damage) -> Path:
    shutil.copytree(source, target)
    damage(target)
    return target


def remove(*names):
    return lambda folder: [(folder / name).unlink() for name in names]


def shard(folder: Path) -> None:
    """The weights as a two-shard index whose second shard is missing."""
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def adapter(base: str | None, weights: bool):
    def damage(folder: Path) -> None:
        for entry in list(folder.iterdir()):
            entry.unlink()
        (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 8}))
        if weights:
            (folder / "adapter_model.safetensors").write_bytes(b"")
    return damage


CASES = {
    "no config": (remove("config.json"), "has no config.json"),
    "config not JSON": (lambda f: (f / "config.json").write_text("{\"vocab_size\": 12,"), "config.json that is not"),
    "no weights": (remove("model.safetensors"), "has config.json but no weights (model.safetensors"),
    "missing shard": (shard, "lacks model-00002-of-00002.safetensors, a weight file its model.safetensors.index"),
    "no tokenizer": (remove("tokenizer.json", "tokenizer_config.json"), "has no tokenizer (tokenizer.json"),
    "adapter without weights": (adapter("sharpgrpo-tiny", False), "has adapter_config.json but no adapter weights"),
    "adapter without base": (adapter(None, True), "names no base_model_name_or_path"),
}


@pytest.mark.parametrize("case", CASES)
def test_an_incomplete_model_folder_is_refused_naming_the_folder_and_file(tiny_model_path, tmp_path, case):
    damage, expected = CASES[case]
    folder = broken_copy(tiny_model_path, tmp_path / "model", damage)
    with pytest.raises(ConfigError) as error:
        check_model_source(str(folder))
    message = str(error.value)
    assert message.startswith(f"model_name_or_path={str(folder)!r}: the folder {folder.resolve()} ")
    assert expected in message and "\n" not in message


def test_complete_folders_and_prepared_names_pass(tiny_model_path, tmp_path):
    check_model_source(tiny_model_path)
    check_model_source("sharpgrpo-tiny")
    check_model_source(str(broken_copy(tiny_model_path, tmp_path / "adapter", adapter("sharpgrpo-tiny", True))))


def test_train_refuses_the_folder_before_touching_output_dir(tiny_model_path, tmp_path, capsys, restore_environment):
    """`sharpgrpo train` with a model folder that lost its weights: one error line naming the field, the folder and
    what is missing; the output folder is neither created nor written."""
    from sharpgrpo.cli import train

    folder = broken_copy(tiny_model_path, tmp_path / "model", remove("model.safetensors"))
    output_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        train.cli(["--config", "demo", "--model_name_or_path", str(folder), "--output_dir", str(output_dir)])
    assert stop.value.code == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: model_name_or_path={str(folder)!r}: the folder {folder.resolve()} has config.json "
                           "but no weights")  # fmt: skip
    assert not output_dir.exists()
