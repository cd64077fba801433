"""Per-token telemetry (`sharpgrpo.training.telemetry.recorder`): the exported columns are the very tensors the loss used.

Each test really trains the tiny model two steps (two micro-batches per step, so TRL shuffles and splits the
generation batch) and captures, inside the loss, what the surrogate received (the advantages and weights passed to
``weighted_policy_surrogate``) and what ``_compute_loss`` returned; the file's columns must equal them bit for bit.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import binary_letters_reward, make_trainer, tiny_config
from trl import GRPOTrainer

import sharpgrpo.training.loss.policy_loss as trainer_module
from sharpgrpo import SharpGRPOTrainer
from sharpgrpo.training.loss.aggregation import aggregate_loss, window_token_share
from sharpgrpo.training.telemetry.recorder import METADATA_KEY, REQUIRED, TelemetryError


class CapturingTrainer(SharpGRPOTrainer):
    """Records, per micro-batch of training, the rows, the surrogate's advantages and weights, the returned loss and
    (with ``equal``) the parent GRPOTrainer's loss on the same inputs."""

    def _compute_loss(self, model, inputs):
        surrogate_calls = []
        original = trainer_module.weighted_policy_surrogate

        def recording(loss_type, ratio, advantages, per_token_logps, weights, placement, **kwargs):
            surrogate_calls.append((advantages.detach().clone(), None if weights is None else weights.detach().clone()))
            return original(loss_type, ratio, advantages, per_token_logps, weights, placement, **kwargs)

        trainer_module.weighted_policy_surrogate = recording
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            trainer_module.weighted_policy_surrogate = original
        if self.model.training:
            parent = None
            if self.args.strategies == ["equal"]:
                with torch.no_grad():
                    parent = GRPOTrainer._compute_loss(self, model, inputs).detach()
            advantages, weights = surrogate_calls[-1]
            self.captured.append({
                "step": self.state.global_step + 1, "rows": inputs["telemetry_row"].clone(),
                "completion_mask": inputs["completion_mask"].clone(), "advantages": advantages, "weights": weights,
                "loss": loss.detach().clone(), "parent": parent,
            })
        return loss


def train(tmp_path, model_path, strategies, **overrides):
    args = tiny_config(tmp_path, strategies=strategies, max_steps=2, token_telemetry=True,
                       per_device_train_batch_size=8, gradient_accumulation_steps=2, **overrides)
    trainer = make_trainer(model_path, args, reward_funcs=[binary_letters_reward], trainer_class=CapturingTrainer)
    trainer.captured = []
    trainer.train()
    return trainer


def token_table(captured: dict, frame, column: str) -> torch.Tensor:
    """The file's ``column`` laid out as the micro-batch's (B, T) tensor (zeros off the completion)."""
    mask = captured["completion_mask"]
    values = torch.zeros(mask.shape, dtype=torch.float32)
    for b, row in enumerate(captured["rows"].tolist()):
        rows = frame[frame["row"] == row].sort_values("position")
        assert rows["position"].tolist() == list(range(int(mask[b].sum())))  # every completion token, once
        values[b, : len(rows)] = torch.tensor(rows[column].to_numpy(), dtype=torch.float32)
    return values


@pytest.mark.parametrize(
    "strategies",
    [["grpo_sg"], ["cw_grpo"], ["grpo_sg", "thr", "passk_mixed"], ["equal"]],
    ids=["weight", "advantage", "composition", "equal"],
)
def test_exported_columns_are_the_loss_tensors(tmp_path, tiny_model_path, strategies):
    trainer = train(tmp_path, tiny_model_path, strategies)
    for step in (1, 2):
        path = tmp_path / "telemetry" / f"telemetry_{step:06d}.parquet"
        file = pq.read_table(path)
        frame = file.to_pandas()
        assert set(REQUIRED) <= set(frame.columns)
        meta = json.loads(file.schema.metadata[METADATA_KEY.encode()])
        assert meta["step"] == step and meta["strategies"] == strategies
        captured = [c for c in trainer.captured if c["step"] == step]
        assert len(captured) == 2  # two micro-batches
        # every completion token of the step's generation batch, once, in global order
        assert len(frame) == sum(int(c["completion_mask"].sum()) for c in captured)
        assert sorted(frame["row"].unique().tolist()) == list(range(16))
        assert (np.diff(frame["row"].to_numpy() * 1000 + frame["position"].to_numpy()) > 0).all()
        for c in captured:
            mask = c["completion_mask"].bool()
            advantages = c["advantages"].expand(mask.shape)
            assert torch.equal(token_table(c, frame, "advantage")[mask], advantages[mask].float())
            if c["weights"] is not None:
                assert torch.equal(token_table(c, frame, "weight")[mask], c["weights"][mask].float())
                name = next(s for s in strategies if s in ("grpo_sg", "equal"))
                assert torch.equal(token_table(c, frame, f"weight/{name}")[mask], c["weights"][mask].float())
            # the loss recomputed from the exported columns (the default loss type: dapo) is the loss returned
            token_loss = token_table(c, frame, "token_loss")
            loss_mask = token_table(c, frame, "mask")
            window = window_token_share(torch.tensor(float(len(frame))), 1, 2, 2)
            recomputed, _ = aggregate_loss(token_loss, loss_mask, trainer.loss_type, accumulation_steps=2,
                                           window_tokens=window)
            assert torch.equal(recomputed, c["loss"])
            if c["parent"] is not None:  # `equal`: the parent GRPOTrainer's own loss
                assert torch.equal(recomputed, c["parent"])
        # the token shares add up to the step's logged loss (logged rounded to 4 significant digits)
        logged = next(e["loss"] for e in trainer.state.log_history if e.get("step") == step and "loss" in e)
        assert frame["loss_contribution"].sum() == pytest.approx(logged, rel=1e-3, abs=1e-6)
        assert float(sum(c["loss"] for c in captured)) == pytest.approx(frame["loss_contribution"].sum(), rel=1e-4, abs=1e-6)
        # per-strategy advantages: the last one is the advantage the loss used, the first starts from TRL's
        stage_names = [s for s in strategies if s not in ("grpo_sg", "equal")]
        if stage_names:
            assert (frame[f"advantage/{stage_names[-1]}"] == frame["advantage"]).all()
        else:
            assert (frame["advantage_trl"] == frame["advantage"]).all()


@pytest.mark.parametrize("strategy", ["cw_grpo", "ar"])
def test_completion_tables_show_the_trained_advantage(tmp_path, tiny_model_path, strategy):
    """Item 2 of issue 33: with an advantage strategy, TRL's completion log (``log_completions``, the saved
    completions) shows each completion's mean token advantage as trained, TRL's value as ``trl_advantage``; for
    ``ar`` (on-policy: folded into the loss) the value the loss used. Upstream (trl==1.16.0 from PyPI,
    ``trl/trainer/grpo_trainer.py``): ``_generate_and_score_completions`` extends ``self._logs["advantages"]`` with
    its own group-normalised advantages (lines 2833-2837), before our strategies replace them, and ``log`` writes
    ``_logs`` as the completions table, ``extra`` columns included (lines 3340-3348)."""
    trainer = train(tmp_path, tiny_model_path, [strategy])
    assert (trainer._folded_strategy() is not None) == (strategy == "ar")
    frame = pq.read_table(tmp_path / "telemetry" / "telemetry_000002.parquet").to_pandas()
    kept = frame[frame["mask"] == 1]
    trained = kept.groupby("row")["advantage"].mean().to_numpy()
    trl = frame.groupby("row")["advantage_trl"].first().to_numpy()
    logged = np.array(trainer._logs["advantages"], dtype=np.float64)
    assert np.allclose(logged, trained, rtol=1e-5, atol=1e-6)
    assert np.array_equal(np.array(trainer._logs["extra"]["trl_advantage"], dtype=np.float32), trl)
    assert not np.allclose(logged, trl)  # the strategy's token advantages really change the logged value
    assert (frame[f"advantage/{strategy}"] == frame["advantage"]).all()


@pytest.mark.slow  # a third training run of the same kind
def test_telemetry_steps_interval(tmp_path, tiny_model_path):
    train(tmp_path, tiny_model_path, ["grpo_sg"], telemetry_steps=2)
    assert sorted(p.name for p in (tmp_path / "telemetry").iterdir()) == ["telemetry_000002.parquet"]


def test_unwritable_telemetry_folder_stops_before_training(tmp_path, tiny_model_path):
    (tmp_path / "telemetry").write_text("a file where the folder should be")
    args = tiny_config(tmp_path, strategies=["grpo_sg"], max_steps=1, token_telemetry=True)
    trainer = make_trainer(tiny_model_path, args)
    with pytest.raises(TelemetryError, match=r"^token_telemetry: cannot write to .*telemetry") as error:
        trainer.train()
    assert "\n" not in str(error.value)
    assert trainer.state.global_step == 0


def test_full_disk_stops_at_the_telemetry_step_keeping_the_last_checkpoint(tmp_path, tiny_model_path):
    """A real full disk: an 8 KiB tmpfs mounted as the telemetry folder (root only; skipped elsewhere). The probe
    before training fits, the first telemetry file (about 20 KB) does not: the run stops at that step with one line,
    the checkpoint of the step before is complete and no partial file is left."""
    import subprocess

    from sharpgrpo.run.lifecycle import COMPLETE_MARKER

    folder = tmp_path / "telemetry"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(folder)], capture_output=True,
                             check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        args = tiny_config(tmp_path, strategies=["grpo_sg"], max_steps=3, token_telemetry=True, telemetry_steps=2,
                           save_strategy="steps", save_steps=1, per_device_train_batch_size=8, num_generations=4)
        trainer = make_trainer(tiny_model_path, args)
        with pytest.raises(TelemetryError, match=r"^token_telemetry: writing .*telemetry_000002\.parquet failed at "
                                                 r"step 2 \(.*No space left on device") as error:
            trainer.train()
        assert "\n" not in str(error.value)
        assert (tmp_path / "checkpoint-1" / COMPLETE_MARKER).exists()
        assert list(folder.iterdir()) == []
    finally:
        unmounted = subprocess.run(["umount", str(folder)], capture_output=True, check=False)
    assert unmounted.returncode == 0, unmounted.stderr  # nothing left open on the full disk
