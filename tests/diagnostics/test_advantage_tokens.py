"""The advantage page of ``sharpgrpo tokens --telemetry``: THR's token advantages as the trainer computed them.

The page reads the run's per-token telemetry (no model, no recomputation); the trainer's own THR token advantages,
dumped by ``dump_token_scores`` from inside the strategy, must be what the page shows, token by token.
"""

from __future__ import annotations

import html
import json
import math
import re
from html.parser import HTMLParser

import pyarrow.parquet as pq
import pytest

from sharpgrpo.cli.tokens import main
from sharpgrpo.diagnostics.token_page import BOOSTED_RGB, DAMPED_RGB, ZEROED

pytestmark = pytest.mark.slow  # trains the tiny model two steps


@pytest.fixture(scope="module")
def thr_run(tiny_model_path, tmp_path_factory):
    """Two real steps of ``thr`` with per-token telemetry, saved completions and the trainer's own token
    advantages dumped (``dump_token_scores``)."""
    from helpers import cpu_config
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset
    from sharpgrpo.run.run_output import CompletionsCallback

    output_dir = tmp_path_factory.mktemp("thr_run")
    args = cpu_config(
        output_dir, strategies=["thr"], thr_p=0.2, temperature=0.9, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1, learning_rate=1e-3,
        save_strategy="no", seed=0, dump_token_scores=True, token_telemetry=True,
    )  # fmt: skip
    trainer = SharpGRPOTrainer(
        model=tiny_model_path, reward_funcs=[allowed_letters_reward], args=args, train_dataset=demo_dataset(32),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
    )  # fmt: skip
    trainer.add_callback(CompletionsCallback(trainer))
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


def test_thr_factors_equal_the_trainers_own_token_advantages(thr_run, tmp_path):
    # Step 1's generation batch was sampled, and its token advantages computed, by the initial model.
    first = thr_run / "telemetry" / "telemetry_000001.parquet"
    result = main(["--telemetry", str(first), "--output", str(tmp_path), "--shade", "factor"])
    assert result["metadata"]["strategies"] == ["thr"] and result["metadata"]["temperature"] == 0.9
    dump = [json.loads(line) for line in (thr_run / "token_scores" / "generation_000001.jsonl").open()]
    frame = pq.read_table(first).to_pandas()
    rows = [frame[frame["row"] == row].sort_values("position") for row in range(8)]
    assert len(dump) == 8 and sorted(frame["row"].unique()) == list(range(8))

    # TRL's sequence advantages in the telemetry are the ones the saved completions keep as `trl_advantage`
    saved = pq.read_table(thr_run / "completions" / "completions_00001.parquet").to_pandas()
    assert [r["advantage_trl"].iloc[0] for r in rows] == pytest.approx(saved["trl_advantage"].tolist(), abs=1e-6)
    # and the saved `advantage` is the one trained on: each completion's mean token advantage
    assert [r["advantage"].mean() for r in rows] == pytest.approx(saved["advantage"].tolist(), abs=1e-5)

    entries, shaded = [], 0
    for rows_i, record in zip(rows, dump):
        assert rows_i["token"].tolist() == record["tokens"]  # the sampled tokens, decoded one by one
        assert rows_i["advantage"].tolist() == pytest.approx(record["advantages"], abs=1e-6)
        assert rows_i["advantage/thr"].tolist() == rows_i["advantage"].tolist()
        sequence_advantage = float(rows_i["advantage_trl"].iloc[0])
        if sequence_advantage == 0:
            assert all(a == 0 for a in record["advantages"])
            entries.append(None)
            continue
        factors = [a / sequence_advantage for a in record["advantages"]]
        assert {round(f, 6) for f in factors} <= {0.0, 0.8, 1.0, 1.2}  # THR: 0, 1 - p, 1, 1 + p
        shaded += sum(f != pytest.approx(1.0) for f in factors)
        entries.append(factors)
    assert shaded > 0  # the batch has mixed groups, so THR changed some tokens

    page = (tmp_path / "tokens.html").read_text()
    assert "<script" not in page and "http" not in page  # self-contained
    parser = Spans()
    parser.feed(page)
    assert len(parser.boxes) == 8
    for rows_i, factors, spans in zip(rows, entries, parser.boxes):
        assert [html.unescape(text) for _, _, text in spans] == rows_i["token"].tolist()  # one span per token
        for (style, title, _), t in zip(spans, range(len(spans))):
            p = float(re.search(r"\bp=([0-9.e-]+)", title).group(1))
            assert p == pytest.approx(math.exp(rows_i["logp"].iloc[t]), abs=1e-3)
            if factors is None:
                assert "background" not in style and "factor=" not in title
                continue
            factor = factors[t]
            assert float(re.search(r"factor=(-?[0-9.e-]+)", title).group(1)) == pytest.approx(factor, abs=1e-3)
            assert "advantage/thr=" in title
            if factor == pytest.approx(0.0, abs=1e-9):
                assert ZEROED in style
            elif factor > 1 + 1e-6:
                assert "rgba({},{},{},1.000)".format(*BOOSTED_RGB) in style  # 1 + p: the page's upper end
            elif factor < 1 - 1e-6:
                assert "rgba({},{},{},1.000)".format(*DAMPED_RGB) in style  # 1 - p: the page's lower end
            else:
                assert ",0.000)" in style  # factor 1: no colour
