"""``sharpgrpo eval`` with vLLM (``backend="vllm"``) on vLLM's CPU build: greedy completions equal transformers'."""

from __future__ import annotations

import gc
import json

from vllm_marks import NEEDS_VLLM

from sharpgrpo.evaluation.runner import evaluate, output_paths

pytestmark = NEEDS_VLLM


def test_eval_generates_with_vllm_and_matches_transformers_greedy(tiny_vllm_model, tmp_path):
    import conftest

    conftest._ENGINES.clear()  # one engine at a time: the trainers' shared one goes first
    gc.collect()
    common = dict(model=tiny_vllm_model, task="kk", kk_people=[2, 3], limit=1, max_new_tokens=12, dtype="float32",
                  progress=False)
    with_vllm = evaluate(**common, backend="vllm", output=str(tmp_path / "vllm.json"))
    gc.collect()
    with_hf = evaluate(**common, backend="transformers", output=str(tmp_path / "hf.json"))
    assert with_vllm["backend"] == "vllm" and with_hf["backend"] == "transformers"
    texts = {}
    for name in ("vllm", "hf"):
        lines = output_paths(tmp_path / f"{name}.json")["samples"].read_text().splitlines()[1:]
        texts[name] = {record["id"]: record["completions"] for record in map(json.loads, lines)}
    assert len(texts["vllm"]) == 2 and texts["vllm"] == texts["hf"]
