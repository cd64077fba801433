"""The distillation strategies' per-token telemetry (docs/methods.md §16.4): on a real 2-step run of the tiny model
with a teacher (the tiny model from another seed), ``opd`` composed with ``iw_opd``, each strategy's declared
columns (``Strategy.columns``: ``teacher_logp``, ``term``, ``iw_opd/weight``) reach the telemetry file through the
one way every kind's per-token diagnostics take (advantage strategies: ``token_columns()``), row by row equal to what
the strategies computed from the batch they saw, described in the file's metadata, and ``sharpgrpo tokens --shade
opd/teacher_logp`` shades the page by it. An undeclared or missing column is refused naming the strategy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_trainer, tiny_config

from sharpgrpo.strategies.distillation import distillation_gap, iw_opd_weights


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    from sharpgrpo.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("teacher") / "qwen2", seed=1))


def test_teacher_columns_reach_the_telemetry_file(tiny_model_path, teacher_path, tmp_path):
    from sharpgrpo.cli.tokens import main as tokens_main
    from sharpgrpo.diagnostics.telemetry import read_telemetry

    run = tmp_path / "run"
    args = tiny_config(run, strategies=["opd", "iw_opd"], teacher_model=teacher_path, opd_coef=0.5, opd_clip=1.0,
                       iw_opd_weight=0.5, token_telemetry=True, max_steps=2)
    trainer = make_trainer(tiny_model_path, args)
    seen = []  # what each generation's opd saw: (teacher log-p, old log-p, mask), global rows
    opd = trainer.advantage_strategies[0]
    original = opd.token_advantages

    def recording(batch):
        seen.append((batch.extras["teacher_logps"].float().clone(), batch.old_logps.float().clone(),
                     batch.completion_mask.float().clone()))
        return original(batch)

    opd.token_advantages = recording
    trainer.train()
    assert len(seen) == 2  # one generation per step
    for step, (teacher, old, mask) in enumerate(seen, start=1):
        frame, meta = read_telemetry(run / "telemetry" / f"telemetry_{step:06d}.parquet")
        rows, positions = frame["row"].to_numpy(), frame["position"].to_numpy()
        gap = distillation_gap(teacher, old, mask)
        expected = {
            "opd/teacher_logp": teacher, "iw_opd/teacher_logp": teacher,
            "opd/term": 0.5 * gap.clamp(-1.0, 1.0),
            "iw_opd/weight": iw_opd_weights(gap, mask, 0.5),
            "iw_opd/term": 0.5 * iw_opd_weights(gap, mask, 0.5) * gap,
        }
        for column, values in expected.items():
            np.testing.assert_allclose(frame[column].to_numpy(), values[rows, positions].numpy(), rtol=0, atol=1e-6,
                                       err_msg=column)
            assert meta["columns"][column].startswith(column.split("/")[0] + " (advantage strategy): ")
        assert "teacher's log-probability" in meta["columns"]["opd/teacher_logp"]
        # the columns are the tokens' own: the clamp and the weights act, the teacher differs from the student
        assert (frame["opd/term"].abs() == 0.5).any() and (frame["opd/term"].abs() < 0.5).any()
        assert frame["iw_opd/weight"].max() > frame["iw_opd/weight"].min()
        # the advantages the strategies passed on: opd adds its term to TRL's, iw_opd mixes opd's with its own
        np.testing.assert_allclose(frame["advantage/opd"], frame["advantage_trl"] + frame["opd/term"], atol=1e-5)
        np.testing.assert_allclose(frame["advantage/iw_opd"], 0.5 * frame["advantage/opd"] + frame["iw_opd/term"],
                                   atol=1e-5)
    out = tmp_path / "tokens"
    tokens_main(["--telemetry", str(run), "--step", "2", "--shade", "opd/teacher_logp", "--output", str(out)])
    page = (out / "tokens.html").read_text(encoding="utf-8")
    assert "opd/teacher_logp" in page


def test_an_undeclared_or_missing_column_is_refused_naming_the_strategy():
    from sharpgrpo.strategies.base import declared_columns
    from sharpgrpo.strategies.distillation import OnPolicyDistillationStrategy

    strategy = OnPolicyDistillationStrategy.__new__(OnPolicyDistillationStrategy)
    value = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"Strategy opd returned the per-token column\(s\) gap, which its class"):
        declared_columns("opd", strategy, {"teacher_logp": value, "term": value, "gap": value}, complete=True)
    with pytest.raises(ValueError, match=r"Strategy opd did not return its declared per-token column\(s\) term"):
        declared_columns("opd", strategy, {"teacher_logp": value}, complete=True)
    assert set(declared_columns("opd", strategy, {"teacher_logp": value, "term": value}, complete=True)) == {
        "teacher_logp", "term"}
