"""The advantage-strategy token page on the real model: one ``thr`` step of ``sharpgrpo-smol`` on the addition task
(conversational prompts through its chat template, BPE completions ending in ``<|im_end|>``), analysed with the model
that sampled it, reproduces the token advantages the trainer dumped (``dump_token_scores``)."""

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_thr_page_reproduces_the_trainers_token_advantages(smol_path, smol_tokenizer, tmp_path):
    from helpers import cpu_config

    from reward_fns import get_reward_function
    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.cli.tokens import main
    from sharpgrpo.data import load_train_dataset
    from sharpgrpo.run.lifecycle import write_training_args
    from sharpgrpo.run.run_output import CompletionsCallback

    run = tmp_path / "run"
    args = cpu_config(
        run, per_device_train_batch_size=16,
        num_generations=8, max_completion_length=12, max_steps=1, learning_rate=1e-5, logging_steps=1,
        save_strategy="no", seed=0, temperature=0.7, beta=0.0, strategies=["thr"], dump_token_scores=True,
        generation_capture=False,
    )  # fmt: skip
    trainer = SharpGRPOTrainer(
        model=smol_path, reward_funcs=[get_reward_function("addition")], args=args,
        train_dataset=load_train_dataset("addition", num_prompts=16, seed=1), processing_class=smol_tokenizer,
    )  # fmt: skip
    trainer.add_callback(CompletionsCallback(trainer))
    write_training_args(args, str(run))
    trainer.train()

    result = main(["--model", smol_path, "--completions", str(run / "completions"), "--output", str(tmp_path / "page")])
    dump = [json.loads(line) for line in (run / "token_scores" / "generation_000001.jsonl").open()]
    entries = result["batches"][0]["completions"]
    assert len(entries) == len(dump) == 16
    compared = 0
    for entry, record in zip(entries, dump):
        assert entry["pieces"] == record["tokens"]  # re-tokenised reply + <|im_end|> = the sampled tokens
        if entry["factors"] is None:
            assert all(a == 0 for a in record["advantages"])
            continue
        expected = [a / entry["advantage"] for a in record["advantages"]]
        assert entry["factors"] == pytest.approx(expected, abs=1e-3)
        compared += len(expected)
    page = (tmp_path / "page" / "tokens.html").read_text()
    assert page.count('class="tok"') == sum(len(e["pieces"]) for e in entries) and "<script" not in page
    if compared == 0:
        pytest.skip("no mixed group in this step: nothing for THR to reweight")
