"""The advantage-strategy token page on the real model: one ``thr`` step of ``sharpgrpo-smol`` on the addition task
(conversational prompts through its chat template, BPE completions ending in ``<|im_end|>``), read from the run's
per-token telemetry (no model), shows the token advantages the trainer dumped (``dump_token_scores``)."""

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_thr_page_reproduces_the_trainers_token_advantages(smol_path, smol_tokenizer, tmp_path):
    from helpers import cpu_config

    from reward_fns import get_reward_function
    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.cli.tokens import main
    from sharpgrpo.data import load_train_dataset
    from sharpgrpo.diagnostics.telemetry import read_telemetry

    run = tmp_path / "run"
    args = cpu_config(
        run, per_device_train_batch_size=16,
        num_generations=8, max_completion_length=12, max_steps=1, learning_rate=1e-5, logging_steps=1,
        save_strategy="no", seed=0, temperature=0.7, beta=0.0, strategies=["thr"], dump_token_scores=True,
        token_telemetry=True,
    )  # fmt: skip
    trainer = SharpGRPOTrainer(
        model=smol_path, reward_funcs=[get_reward_function("addition")], args=args,
        train_dataset=load_train_dataset("addition", num_prompts=16, seed=1), processing_class=smol_tokenizer,
    )  # fmt: skip
    trainer.train()

    main(["--telemetry", str(run), "--output", str(tmp_path / "page"), "--shade", "factor", "--max_groups", "2"])
    frame, _ = read_telemetry(run / "telemetry" / "telemetry_000001.parquet")
    dump = [json.loads(line) for line in (run / "token_scores" / "generation_000001.jsonl").open()]
    entries = [frame[frame["row"] == row].sort_values("position") for row in range(16)]
    assert len(dump) == 16 and frame["row"].nunique() == 16
    compared = 0
    for entry, record in zip(entries, dump):
        assert entry["token"].tolist() == record["tokens"]  # the sampled tokens, <|im_end|> included
        sequence_advantage = float(entry["advantage_trl"].iloc[0])
        if sequence_advantage == 0:
            assert all(a == 0 for a in record["advantages"])
            continue
        expected = [a / sequence_advantage for a in record["advantages"]]
        assert entry["factor"].tolist() == pytest.approx(expected, abs=1e-3)
        compared += len(expected)
    page = (tmp_path / "page" / "tokens.html").read_text()
    assert page.count('class="tok') == sum(len(e) for e in entries[:16]) and "<script" not in page
    if compared == 0:
        pytest.skip("no mixed group in this step: nothing for THR to reweight")
