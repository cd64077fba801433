"""The `--model` token page (`sharpgrpo.diagnostics.token_page`): pieces of byte tokens, legend against the weights
drawn, and pages of at most PAGE_SIZE completions."""

from __future__ import annotations

import random
import re

import pytest

from sharpgrpo.diagnostics.token_page import PAGE_SIZE, token_pieces, write_token_page


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def test_pieces_join_and_bytes_of_no_character_show_their_bytes(tokenizer):
    ids = tokenizer("aé€b", add_special_tokens=False)["input_ids"]
    pieces = token_pieces(tokenizer, ids)
    assert "".join(pieces) == "aé€b" and len(pieces) == len(ids)
    assert "é" in pieces and "€" in pieces  # each character on the token completing it
    assert "\ufffd" not in "".join(token_pieces(tokenizer, ids[:-2]))
    # "€" cut after two of its three bytes (E2 82 AC), and a stray second byte of "é" (C3 A9): their bytes, per token
    cut = token_pieces(tokenizer, ids[:-2])
    assert "".join(cut[-2:]) == "<0xE2><0x82>"
    e_acute = tokenizer("é", add_special_tokens=False)["input_ids"]
    assert token_pieces(tokenizer, [ids[0], e_acute[-1], ids[-1]]) == ["a", "<0xA9>", "b"]


def completion(rng, index):
    n = rng.randint(1, 6)
    return {"prompt": f"prompt {index}", "pieces": [f"t{index}_{i}" for i in range(n)],
            "probs": [rng.random() for _ in range(n)],
            "weights": [rng.choice([1.0, 1.0, 1.4, 1.0 + rng.random() * 0.4, 0.5 + rng.random() / 2]) for _ in range(n)],
            "scores": {"reward": rng.random()}}  # fmt: skip


def test_pages_hold_at_most_page_size_completions_and_link_each_other(tmp_path):
    rng = random.Random(0)
    entries = [completion(rng, i) for i in range(2 * PAGE_SIZE + 7)]
    (tmp_path / "tokens_9.html").write_text("stale")  # a page of an earlier, longer run of the command
    write_token_page(tmp_path / "tokens.html", entries, "grpo_sg", (1.0, 1.4), {"temperature": 1.0})
    pages = sorted(tmp_path.glob("tokens*.html"))
    assert [p.name for p in pages] == ["tokens.html", "tokens_2.html", "tokens_3.html"]
    seen = []
    for page in pages:
        text = page.read_text()
        seen += [int(i) for i in re.findall(r'<div class="scores">#(\d+) ', text)]
        assert all(f'href="{other.name}"' in text for other in pages if other != page)
        # legend: exactly the colours the page draws, with each bin's count
        drawn = re.findall(r'<span class="tok[^"]*" style="background:([^"]*)"', text)
        swatches = re.findall(r'<span class="swatch[^"]*" style="background:([^"]*)">w [^<]*: (\d+)</span>', text)
        assert sorted({css for css, _ in swatches}) == sorted(set(drawn))
        assert all(drawn.count(css) == int(count) for css, count in swatches)
    assert seen == list(range(len(entries)))
    assert len(re.findall('<div class="completion">', pages[0].read_text())) == PAGE_SIZE
