"""Advantage-strategy token page on a real run: the factors A[i,t] / A[i] of ``thr`` recomputed from the run's saved
completions equal the token advantages the trainer itself used (its ``dump_token_scores`` of the same generation
batch, analysed with the model that sampled it), and the HTML page shows them."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser

import pytest
import torch

from sharpgrpo.cli.tokens import main
from sharpgrpo.diagnostics.advantage_tokens import trl_sequence_advantages
from sharpgrpo.diagnostics.token_page import BOOSTED_RGB, DAMPED_RGB, ZEROED
from sharpgrpo.diagnostics.tokens import read_logged_rows

pytestmark = pytest.mark.slow  # trains the tiny model two steps


@pytest.fixture(scope="module")
def thr_run(tiny_model_path, tmp_path_factory):
    """Two real steps of ``thr`` with saved completions, the trainer's own token advantages dumped
    (``dump_token_scores``), and hidden states from a forward pass (``generation_capture: false``), as the analysis
    computes them. ``training_args.json`` is written as train.py writes it."""
    from helpers import cpu_config
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset
    from sharpgrpo.run.lifecycle import write_training_args
    from sharpgrpo.run.run_output import CompletionsCallback

    output_dir = tmp_path_factory.mktemp("thr_run")
    args = cpu_config(
        output_dir, strategies=["thr"], thr_p=0.2, temperature=0.9, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1, learning_rate=1e-3,
        save_strategy="no", seed=0, dump_token_scores=True, generation_capture=False,
    )  # fmt: skip
    trainer = SharpGRPOTrainer(
        model=tiny_model_path, reward_funcs=[allowed_letters_reward], args=args, train_dataset=demo_dataset(32),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
    )  # fmt: skip
    trainer.add_callback(CompletionsCallback(trainer))
    write_training_args(args, str(output_dir))
    trainer.train()
    return output_dir


class Spans(HTMLParser):
    """The token spans of each completion box: (style, title, text)."""

    def __init__(self):
        super().__init__()
        self.boxes, self._span = [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and attrs.get("class") == "completion":
            self.boxes.append([])
        elif tag == "span" and attrs.get("class") == "tok":
            self._span = [attrs.get("style", ""), attrs.get("title", ""), ""]

    def handle_data(self, data):
        if self._span is not None:
            self._span[2] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._span is not None:
            self.boxes[-1].append(tuple(self._span))
            self._span = None


def test_thr_factors_equal_the_trainers_own_token_advantages(thr_run, tiny_model_path, tmp_path):
    # Step 1's generation batch was sampled, and its token advantages computed, by the initial model.
    first = thr_run / "completions" / "completions_00001.parquet"
    result = main(["--model", tiny_model_path, "--completions", str(first), "--output", str(tmp_path)])
    assert result["strategies"] == ["thr"] and result["temperature"] == 0.9  # from the run's training_args.json
    dump = [json.loads(line) for line in (thr_run / "token_scores" / "generation_000001.jsonl").open()]
    _, completions, scores = read_logged_rows(first)
    entries = result["batches"][0]["completions"]
    assert len(entries) == len(dump) == len(completions) == 8

    # TRL's own advantages, as saved, equal the recomputation from the saved rewards
    rewards = torch.tensor([[s["allowed_letters_reward"]] for s in scores])
    recomputed = trl_sequence_advantages(rewards, torch.ones(1), 4)
    assert recomputed.tolist() == pytest.approx([s["advantage"] for s in scores], abs=1e-5)

    shaded = 0
    for entry, record, sequence_advantage in zip(entries, dump, recomputed.tolist()):
        assert entry["pieces"] == record["tokens"]  # re-tokenised text + EOS = the sampled tokens
        assert entry["advantage"] == pytest.approx(sequence_advantage, abs=1e-6)
        if entry["factors"] is None:
            assert sequence_advantage == 0 and all(a == 0 for a in record["advantages"])
            continue
        expected = [a / sequence_advantage for a in record["advantages"]]
        assert entry["factors"] == pytest.approx(expected, abs=1e-4)
        assert entry["strategy_factors"][0]["scores"] == pytest.approx(record["scores"], rel=1e-3, abs=1e-6)
        assert {round(f, 6) for f in entry["factors"]} <= {0.0, 0.8, 1.0, 1.2}  # THR: 0, 1 - p, 1, 1 + p
        shaded += sum(f != 1.0 for f in entry["factors"])
    assert shaded > 0  # the batch has mixed groups, so THR changed some tokens

    page = (tmp_path / "tokens.html").read_text()
    assert "<script" not in page and "http" not in page  # self-contained
    parser = Spans()
    parser.feed(page)
    assert len(parser.boxes) == len(entries)
    for entry, spans in zip(entries, parser.boxes):
        assert [html.unescape(text) for _, _, text in spans] == entry["pieces"]  # one span per token
        for (style, title, _), t in zip(spans, range(len(spans))):
            p = float(re.search(r"p=([0-9.]+)", title).group(1))
            assert p == pytest.approx(entry["probs"][t], abs=1e-3)
            if entry["factors"] is None:
                assert "background" not in style and "factor=" not in title
                continue
            factor = entry["factors"][t]
            assert float(re.search(r"factor=(-?[0-9.]+)", title).group(1)) == pytest.approx(factor, abs=1e-3)
            assert "thr score=" in title
            if factor == pytest.approx(0.0, abs=1e-9):
                assert ZEROED in style
            elif factor > 1 + 1e-6:
                assert "rgba({},{},{},1.000)".format(*BOOSTED_RGB) in style  # 1 + p: the page's upper end
            elif factor < 1 - 1e-6:
                assert "rgba({},{},{},1.000)".format(*DAMPED_RGB) in style  # 1 - p: the page's lower end
            else:
                assert ",0.000)" in style  # factor 1: no colour
