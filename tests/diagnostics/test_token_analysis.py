"""Token analysis on a real run's logged completions: per-token mean probability and strategy weight, checked
against an independent per-completion computation."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from sharpgrpo.cli.tokens import main
from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.diagnostics.tokens import analyze_tokens, display_token, read_logged_completions
from sharpgrpo.evaluation.models import load_model_and_tokenizer
from sharpgrpo.strategies.probability_shaping import probability_shaping_weights

RUN_STEPS, ROWS_PER_STEP = 3, 8


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return load_model_and_tokenizer(tiny_model_path, device="cpu")


def independent_token_means(model, tokenizer, prompts, completions, temperature=1.0):
    """One completion at a time, no padding: mean probability and GRPO-SG weight (defaults) per token id."""
    sums = defaultdict(lambda: [0, 0.0, 0.0])
    for prompt, completion in zip(prompts, completions):
        prompt_ids = tokenizer(prompt)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt_ids + completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1] / temperature
        probs = torch.softmax(logits.double(), -1).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1)
        weights = probability_shaping_weights(probs.float(), 2.0, 0.25, 1 / 9, 1.0, 1.4)
        for token, p, w in zip(completion_ids, probs.tolist(), weights.tolist()):
            sums[token][0] += 1
            sums[token][1] += p
            sums[token][2] += w
    return {t: (n, p / n, w / n) for t, (n, p, w) in sums.items()}


@pytest.mark.slow  # trains the tiny model (tiny_runs)
def test_logged_completions_of_a_real_run(tiny_runs):
    prompts, completions = read_logged_completions(tiny_runs["grpo_sg"] / "completions")
    assert len(prompts) == len(completions) == RUN_STEPS * ROWS_PER_STEP
    assert all(p.startswith("letters: ") for p in prompts) and all(isinstance(c, str) for c in completions)


@pytest.mark.slow  # trains the tiny model (tiny_runs)
def test_token_table_matches_an_independent_computation(tiny_runs, tiny, tmp_path):
    model, tokenizer = tiny
    prompts, completions = read_logged_completions(tiny_runs["grpo_sg"] / "completions")
    result = analyze_tokens(
        model, tokenizer, prompts, completions, strategy="grpo_sg", top=5, min_count=3, batch_size=5,
        output=tmp_path,
    )  # fmt: skip
    reference = independent_token_means(model, tokenizer, prompts, completions)
    assert result["overall"]["tokens"] == sum(n for n, _, _ in reference.values())
    listed = result["high"] + result["low"]
    assert listed and len({e["token_id"] for e in listed}) == len(listed)  # the two lists do not overlap
    for entry in listed:
        count, mean_prob, mean_weight = reference[entry["token_id"]]
        assert entry["count"] == count >= 3
        assert entry["mean_prob"] == pytest.approx(mean_prob, abs=1e-5)
        assert entry["mean_weight"] == pytest.approx(mean_weight, abs=1e-4)
    highs = [e["mean_prob"] for e in result["high"]]
    lows = [e["mean_prob"] for e in result["low"]]
    assert highs == sorted(highs, reverse=True) and lows == sorted(lows) and min(highs) >= max(lows)
    eligible = sorted((p for n, p, _ in reference.values() if n >= 3), reverse=True)
    assert highs[0] == pytest.approx(eligible[0], abs=1e-5)  # the most probable frequent token heads the table
    for name in ("tokens.json", "tokens.md", "tokens.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| Rank | Token | Count | Mean prob | Mean weight |" in (tmp_path / "tokens.md").read_text()


def test_left_and_right_padding_do_not_change_the_numbers(tiny):
    model, tokenizer = tiny
    prompts = [p if i % 2 else "some longer preamble. " + p for i, p in enumerate(demo_dataset(6)["prompt"])]
    completions = [" abcabc", " hh", " gfedcbaa", " a", " cab", " hhhhh"]
    result = analyze_tokens(model, tokenizer, prompts, completions, strategy="grpo_sg", top=50, min_count=1)
    reference = independent_token_means(model, tokenizer, prompts, completions)
    assert len(result["high"]) + len(result["low"]) == len(reference)
    for entry in result["high"] + result["low"]:
        count, mean_prob, mean_weight = reference[entry["token_id"]]
        assert (entry["count"], entry["mean_prob"]) == (count, pytest.approx(mean_prob, abs=1e-5))
        assert entry["mean_weight"] == pytest.approx(mean_weight, abs=1e-4)


@pytest.mark.slow  # trains the tiny model (tiny_runs)
def test_reverse_strategy_mirrors_the_weights(tiny_runs, tiny):
    model, tokenizer = tiny
    prompts, completions = read_logged_completions(tiny_runs["grpo_sg"] / "completions", max_rows=8)
    forward = analyze_tokens(model, tokenizer, prompts, completions, strategy="grpo_sg", top=3, min_count=1)
    reverse = analyze_tokens(model, tokenizer, prompts, completions, strategy="reverse", top=3, min_count=1)
    assert [e["token_id"] for e in forward["high"]] == [e["token_id"] for e in reverse["high"]]
    for a, b in zip(forward["high"] + forward["low"], reverse["high"] + reverse["low"]):
        assert a["mean_weight"] + b["mean_weight"] == pytest.approx(2.0, abs=1e-6)  # w' = 2 - w


def test_sampling_from_prompts_and_strategy_parameters(tiny, tmp_path):
    model, tokenizer = tiny
    prompts = list(demo_dataset(4)["prompt"])
    with pytest.warns(UserWarning, match="constant"):  # the papers' printed tau: every weight is 1 (docs/methods.md §1)
        flat = analyze_tokens(
            model, tokenizer, prompts, strategy="grpo_sg", num_samples=2, max_new_tokens=8, min_count=1, sg_tau=9.0
        )
    assert flat["overall"]["tokens"] > 0
    assert all(e["mean_weight"] == pytest.approx(1.0) for e in flat["high"] + flat["low"])
    with pytest.raises(ValueError, match="advantage strategy"):
        analyze_tokens(model, tokenizer, prompts[:1], ["abc"], strategy="cw_grpo")


def test_cli_on_prompts_file(tiny_model_path, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("letters: a b c\\nword:\nletters: d e f\\nword:\n")
    main(["--model", tiny_model_path, "--prompts", str(prompts), "--output", str(tmp_path / "out"),
          "--num_samples", "2", "--max_new_tokens", "6", "--min_count", "1", "--set", "sg_upper=1.3"])  # fmt: skip
    assert (tmp_path / "out" / "tokens.png").is_file()
    assert "Token analysis under `grpo_sg`" in capsys.readouterr().out


def test_display_token():
    assert display_token(" a\n\t") == "␣a\\n\\t"
    assert display_token("") == "''"


@pytest.fixture(scope="module")
def reverse_run(tiny_model_path, tmp_path_factory):
    """A real two-step run with a non-default temperature, sg_tau and strategy, saving its completions."""
    from helpers import cpu_config, make_trainer

    from sharpgrpo.run.run_output import CompletionsCallback

    output_dir = tmp_path_factory.mktemp("reverse_run")
    args = cpu_config(
        output_dir, strategies=["reverse"], temperature=0.7, sg_tau=0.2, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1, save_strategy="no", seed=0,
    )  # fmt: skip
    trainer = make_trainer(tiny_model_path, args, train_dataset=32)
    trainer.add_callback(CompletionsCallback(trainer))
    trainer.train()
    return output_dir


@pytest.mark.slow  # trains the tiny model two steps
def test_cli_uses_the_runs_own_settings_and_writes_the_token_page(reverse_run, tiny_model_path, tiny, tmp_path):
    import html
    import re

    from sharpgrpo.strategies.probability_shaping import reverse_probability_shaping_weights

    model, tokenizer = tiny
    result = main(["--model", tiny_model_path, "--completions", str(reverse_run / "completions"),
                   "--output", str(tmp_path), "--min_count", "1"])  # fmt: skip
    assert result["strategy"] == "reverse" and result["temperature"] == 0.7  # from the run's training_args.json
    prompts, completions = read_logged_completions(reverse_run / "completions")
    page = (tmp_path / "tokens.html").read_text()
    assert "<script" not in page and "http" not in page  # self-contained
    blocks = page.split('<div class="completion">')[1:]
    assert len(blocks) == len(completions) == 2 * 8
    for prompt, completion, block in zip(prompts, completions, blocks):
        spans = re.findall(r'title="p=([0-9.]+) w=([0-9.]+)">(.*?)</span>', block, flags=re.DOTALL)
        assert "".join(html.unescape(text) for _, _, text in spans) == completion
        # independent reference: one completion, no padding, temperature 0.7, the reverse weight with sg_tau 0.2
        prompt_ids = tokenizer(prompt)["input_ids"]
        ids = prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, len(prompt_ids) - 1 : -1].double() / 0.7
        probs = torch.softmax(logits, -1).gather(-1, torch.tensor(ids[len(prompt_ids) :])[:, None]).squeeze(-1)
        weights = reverse_probability_shaping_weights(probs.float(), 2.0, 0.25, 0.2, 1.0, 1.4)
        assert [float(p) for p, _, _ in spans] == pytest.approx(probs.tolist(), abs=2e-3)
        assert [float(w) for _, w, _ in spans] == pytest.approx(weights.tolist(), abs=2e-3)
        assert "allowed_letters_reward <b>" in block and "advantage <b>" in block
