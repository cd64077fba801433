"""``sharpgrpo eval`` sized for the model: the new-token budget defaults to the run's own
``max_completion_length`` (``training_args.json``, written by training beside the model and in each checkpoint),
else the papers' 4096, capped by the model's ``max_position_embeddings``."""

from __future__ import annotations

import json
import shutil

from sharpgrpo.evaluation import evaluate, output_paths
from sharpgrpo.evaluation.runner import PAPERS_MAX_NEW_TOKENS, default_max_new_tokens


def model_copy(tiny_model_path, folder, max_position_embeddings=None):
    shutil.copytree(tiny_model_path, folder)
    if max_position_embeddings is not None:
        config = json.loads((folder / "config.json").read_text())
        config["max_position_embeddings"] = max_position_embeddings
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_budget_from_the_run_then_papers_then_capped(tiny_model_path, tmp_path):
    run = model_copy(tiny_model_path, tmp_path / "run", max_position_embeddings=512)
    expected = f"the papers' {PAPERS_MAX_NEW_TOKENS}, capped at the model's max_position_embeddings"
    assert default_max_new_tokens(str(run)) == (512, expected)
    (run / "training_args.json").write_text(json.dumps({"max_completion_length": 7}))
    assert default_max_new_tokens(str(run))[0] == 7
    checkpoint = model_copy(tiny_model_path, run / "checkpoint-2", max_position_embeddings=512)
    assert default_max_new_tokens(str(checkpoint))[0] == 7  # a checkpoint: its run folder's setting
    (run / "training_args.json").write_text(json.dumps({"max_completion_length": 100_000}))
    assert default_max_new_tokens(str(run))[0] == 512


def test_evaluate_uses_the_run_budget(tiny_model_path, tmp_path):
    run = model_copy(tiny_model_path, tmp_path / "run")
    (run / "training_args.json").write_text(json.dumps({"max_completion_length": 5}))
    result = evaluate(model=str(run), task="kk", kk_people=[2, 3], limit=1, output=str(tmp_path / "kk.json"),
                      progress=False)  # fmt: skip
    assert result["settings"]["max_new_tokens"] == 5
    lines = output_paths(tmp_path / "kk.json")["samples"].read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    assert len(records) == 2 and all(0 < n <= 5 for r in records for n in r["num_tokens"])


def test_without_a_run_each_task_has_its_own_budget(tiny_model_path, tmp_path):
    """A prepared model has no run folder: the budget is the task's, not the papers' 4096 (on 2 CPU cores a greedy
    addition reply that looped to 4096 tokens made `sharpgrpo eval --task addition` run 38 minutes)."""
    model = str(model_copy(tiny_model_path, tmp_path / "model", max_position_embeddings=8192))
    assert default_max_new_tokens(model, "addition") == (16, "the addition task's default 16")
    assert default_max_new_tokens(model, "qa")[0] == default_max_new_tokens(model, "search_qa")[0] == 500
    assert default_max_new_tokens(model, "kk")[0] == default_max_new_tokens(model, "math")[0] == PAPERS_MAX_NEW_TOKENS
    (tmp_path / "model" / "training_args.json").write_text(json.dumps({"max_completion_length": 9}))
    assert default_max_new_tokens(model, "addition")[0] == 9  # the run's own setting still comes first
    result = evaluate(model="sharpgrpo-tiny", task="addition", limit=2, output=str(tmp_path / "add.json"),
                      progress=False)  # fmt: skip
    assert result["settings"]["max_new_tokens"] == 16
