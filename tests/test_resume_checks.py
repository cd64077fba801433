"""Resuming is checked before the model loads (``sharpgrpo.run.lifecycle.check_resume_compatible``): a checkpoint saved
for another architecture is refused naming the differing field; one saved by a run with other settings warns naming
each field with both values."""

from __future__ import annotations

import json
import types

import pytest

from sharpgrpo.run.lifecycle import TRAINING_ARGS_JSON, CheckpointError, check_resume_compatible

MODEL = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 260}


def checkpoint(tmp_path, config: dict, strategies: list[str]):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / TRAINING_ARGS_JSON).write_text(json.dumps({"strategies": strategies}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": []}))
    return str(folder)


def test_another_architecture_is_refused_naming_the_field(tmp_path):
    saved = checkpoint(tmp_path, {**MODEL, "num_hidden_layers": 28}, ["grpo_sg"])
    args = types.SimpleNamespace(strategies=["grpo_sg"])
    with pytest.raises(CheckpointError, match=r"saved for another model \(num_hidden_layers 28; the model being "
                       r"trained has 2\)"):  # fmt: skip
        check_resume_compatible(saved, args, MODEL)


def test_other_strategies_warn_naming_both(tmp_path):
    saved = checkpoint(tmp_path, MODEL, ["grpo_sg"])
    with pytest.warns(UserWarning, match=r"\(step 4\) was saved by a run with other settings: strategies \['grpo_sg'\] "
                      r"-> \['equal'\]"):  # fmt: skip
        check_resume_compatible(saved, types.SimpleNamespace(strategies=["equal"]), MODEL)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_resume_compatible(saved, types.SimpleNamespace(strategies=["grpo_sg"]), MODEL)
        check_resume_compatible(None, types.SimpleNamespace(strategies=["equal"]), MODEL)
