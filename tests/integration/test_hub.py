"""Publishing to the Hub, tested up to the upload (this machine cannot reach the Hub).

`push_to_hub`, `hub_model_id` and `hub_strategy` are TRL's (transformers') own: ``trainer.push_to_hub()`` saves the
model into ``output_dir``, writes the model card there and uploads the folder with ``upload_folder`` (ignoring
``_*`` and ``checkpoint-*``); with ``hub_strategy`` "checkpoint"/"all_checkpoints" every saved checkpoint folder is
uploaded too, so it must already hold everything a resume needs. What is checked here: the folder that would be
uploaded (weights, tokenizer, card), the card's content (the strategy, its parameters, the paper, the repository
id), the checkpoint folder's content, and the error offline. Offline (``HF_HUB_OFFLINE=1``) the Hub client refuses
at once with ``huggingface_hub.errors.OfflineModeIsEnabled`` ("Cannot reach https://huggingface.co/api/repos/create:
offline mode is enabled"): at trainer construction when ``push_to_hub=True`` (transformers creates the repository
there, before training), and at ``trainer.push_to_hub()`` otherwise. Without ``HF_HUB_OFFLINE`` and without a
network the same calls fail with a connection error after the client's retries.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _launch_worker import build_config
from helpers import make_trainer

from sharpgrpo import SharpGRPOTrainer

pytestmark = pytest.mark.slow

HUB_ID = "sharpgrpo-tests/tiny-grpo-sg"


def make_hub_trainer(model_path: str, output_dir: Path, **overrides) -> SharpGRPOTrainer:
    """The multi-process worker's config (``build_config``) on 32 demo prompts."""
    return make_trainer(model_path, build_config(str(output_dir), **overrides), train_dataset=32)


def files_to_upload(folder: Path) -> set[str]:
    """What ``Trainer.push_to_hub`` would upload: ``upload_folder(folder, ignore_patterns=["_*", "checkpoint-*"])``."""
    from huggingface_hub.utils import filter_repo_objects

    paths = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return set(filter_repo_objects(paths, ignore_patterns=["_*", "checkpoint-*"]))


def test_push_to_hub_folder_and_card(tiny_model_path, tmp_path):
    from huggingface_hub.errors import OfflineModeIsEnabled

    output_dir = tmp_path / "out"
    trainer = make_hub_trainer(
        tiny_model_path, output_dir, strategies="grpo_sg", max_steps=2, save_strategy="steps", save_steps=2,
        hub_model_id=HUB_ID, hub_strategy="checkpoint", sg_upper=1.3,
    )
    trainer.train()
    # push_to_hub() = save_model + create_model_card + upload_folder; the first two, then what the third would send.
    trainer.save_model()
    trainer.create_model_card(dataset_name="demo")
    uploaded = files_to_upload(output_dir)
    for name in ("README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "training_args.bin"):
        assert name in uploaded, name
    assert not any(name.startswith("checkpoint-") for name in uploaded)

    card = (output_dir / "README.md").read_text()
    assert "## sharpgrpo strategies" in card and card.count("## sharpgrpo strategies") == 1
    assert "**`grpo_sg`**" in card
    for parameter in ("sg_alpha=2.0", "sg_mu=0.25", "sg_tau=0.1111111111111111", "sg_lower=1.0", "sg_upper=1.3",
                      "weight_placement='loss'", "kl_weighting='loss'"):
        assert f"`{parameter}`" in card, parameter
    assert "Sharpness-Guided Group Relative Policy Optimization via Probability Shaping" in card
    assert "This model was trained with SharpGRPO" in card
    assert f'model="{HUB_ID}"' in card and "# Model Card for tiny-grpo-sg" in card  # not "None" before the push
    assert "tags:" in card and "- sharpgrpo" in card

    # hub_strategy="checkpoint" uploads the checkpoint folder as `last-checkpoint`: it holds the resume state.
    checkpoint = output_dir / "checkpoint-2"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
                 "sharpgrpo_strategy_state.pt"):
        assert (checkpoint / name).is_file(), name

    # The upload itself: offline the Hub client refuses before sending anything.
    with pytest.raises(OfflineModeIsEnabled, match="offline mode is enabled"):
        trainer.push_to_hub(dataset_name="demo")


def test_push_to_hub_true_fails_at_construction_offline(tiny_model_path, tmp_path):
    from huggingface_hub.errors import OfflineModeIsEnabled

    with pytest.raises(OfflineModeIsEnabled, match="api/repos/create"):
        make_hub_trainer(tiny_model_path, tmp_path / "out", strategies="cw_grpo", push_to_hub=True, hub_model_id=HUB_ID)


def test_model_card_names_every_strategy(tiny_model_path, tmp_path):
    trainer = make_hub_trainer(tiny_model_path, tmp_path / "out", strategies=["grpo_sg", "cw_grpo"], thr_p=-0.1)
    trainer.create_model_card()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "**`cw_grpo`**" in card and "`cw_scope='group'`" in card and "`cw_sigma_eps=1e-08`" in card
    assert "Covariance-Aware GRPO" in card
    assert "# Model Card for out" in card  # no hub_model_id: named after the output folder, as TRL's checkpoints are
