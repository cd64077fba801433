"""``sharpgrpo tokens --telemetry``: the token page read from per-token telemetry, with no model.

Two real runs of the tiny model with the same seed: one with a weight strategy and an advantage strategy registered
by this test (not one of ours), one with ``equal`` and two iterations per generation batch (so that step 2 trains
the same batch off-policy and the clip acts).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch

from sharpgrpo.cli.tokens import main
from sharpgrpo.diagnostics.telemetry import TelemetryFileError, read_telemetry

EVEN_BOOST = "test_even_positions_boost"


def register_even_boost():
    """An advantage strategy a user could register: doubles the advantage of even token positions."""
    from sharpgrpo.strategies import STRATEGIES, AdvantageStrategy, register_strategy

    if EVEN_BOOST in STRATEGIES:
        return

    @register_strategy(EVEN_BOOST)
    class EvenBoost(AdvantageStrategy):
        needs_old_logps = False

        def token_advantages(self, batch):
            factor = torch.ones_like(batch.advantages)
            factor[:, ::2] = 2.0
            return batch.advantages * factor, {}


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory):
    from helpers import binary_letters_reward, make_trainer, tiny_config

    register_even_boost()
    folders = {}
    for name, strategies, extra in (
        ("boost", ["grpo_sg", EVEN_BOOST], {}),
        ("equal", ["equal"], {"num_iterations": 2, "epsilon": 1e-3}),
    ):
        folder = tmp_path_factory.mktemp(name)
        args = tiny_config(folder, strategies=strategies, max_steps=2, token_telemetry=True, **extra)
        make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward]).train()
        folders[name] = folder
    return folders


class Boxes(HTMLParser):
    """Per completion box: its header text and its token spans (class, title, text)."""

    def __init__(self):
        super().__init__()
        self.boxes, self._span, self._header = [], None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and attrs.get("class") == "completion":
            self.boxes.append({"header": "", "spans": []})
        elif tag == "div" and attrs.get("class") == "scores":
            self._header = True
        elif tag == "span" and "tok" in (attrs.get("class") or "").split():
            self._span = [attrs.get("class"), attrs.get("title", ""), "", attrs.get("style", "")]

    def handle_data(self, data):
        if self._span is not None:
            self._span[2] += data
        elif self._header:
            self.boxes[-1]["header"] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._span is not None:
            self.boxes[-1]["spans"].append(tuple(self._span))
            self._span = None
        elif tag == "div":
            self._header = False


def page_boxes(folder) -> list[dict]:
    parser = Boxes()
    parser.feed((folder / "tokens.html").read_text())
    return parser.boxes


def test_a_registered_strategy_shows_up_on_the_page(runs, tmp_path):
    result = main(["--telemetry", str(runs["boost"]), "--step", "1", "--output", str(tmp_path),
                   "--shade", "factor", "--max_groups", "99"])
    frame, meta = read_telemetry(runs["boost"] / "telemetry" / "telemetry_000001.parquet")
    assert meta["strategies"] == ["grpo_sg", EVEN_BOOST] and result["column"] == "factor"
    nonzero = frame[frame["advantage_trl"] != 0]
    assert len(nonzero) > 0
    expected = torch.where(torch.tensor(nonzero["position"].to_numpy()) % 2 == 0, 2.0, 1.0)
    assert torch.equal(torch.tensor(nonzero["factor"].to_numpy(), dtype=torch.float64), expected.double())
    boxes = page_boxes(tmp_path)
    assert len(boxes) == frame["row"].nunique() == 16
    for row, box in enumerate(boxes):
        tokens = frame[frame["row"] == row].sort_values("position")
        assert [s[2] for s in box["spans"]] == tokens["token"].tolist()
        for (_, title, _, _), (_, token) in zip(box["spans"], tokens.iterrows(), strict=True):
            shown = float(re.search(rf"advantage/{EVEN_BOOST}=(-?[0-9.e+-]+)", title).group(1))
            assert shown == pytest.approx(float(token[f"advantage/{EVEN_BOOST}"]), rel=1e-3)
            assert float(re.search(r"\bweight=([0-9.e+-]+)", title).group(1)) == pytest.approx(token["weight"], rel=1e-3)
    page = (tmp_path / "tokens.html").read_text()
    assert "<script" not in page and "http" not in page
    assert (tmp_path / "telemetry.png").read_bytes()[:4] == b"\x89PNG"
    # GRPO-SG App. C.3's table, from the weights as trained
    kept = frame[frame["mask"] == 1]
    assert result["high"] and result["overall"]["tokens"] == len(kept)
    for entry in result["high"] + result["low"]:
        tokens = kept[kept["token_id"] == entry["token_id"]]
        assert entry["count"] == len(tokens) >= 5
        assert entry["mean_weight"] == pytest.approx(float(tokens["weight"].astype("float64").mean()))
    assert (tmp_path / "tokens.md").read_text().startswith(f"Token analysis under `grpo_sg x {EVEN_BOOST}`")


def test_group_pick_and_clipped_filter(runs, tmp_path):
    main(["--telemetry", str(runs["boost"]), "--group", "1", "--output", str(tmp_path / "group")])
    boxes = page_boxes(tmp_path / "group")
    assert [re.search(r"group (\d+)", b["header"]).group(1) for b in boxes] == ["1"] * 8
    # step 2 of the `equal` run trains step 1's batch again after an update: off-policy, the 1e-3 clip acts
    frame, _ = read_telemetry(runs["equal"] / "telemetry" / "telemetry_000002.parquet")
    clipped = frame[frame["clip_low"] | frame["clip_high"]]
    assert 0 < len(clipped) < len(frame)
    result = main(["--telemetry", str(runs["equal"]), "--filter", "clipped", "--output", str(tmp_path / "clip"),
                   "--shade", "ratio", "--max_groups", "99"])
    assert result["step"] == 2
    boxes = page_boxes(tmp_path / "clip")
    assert len(boxes) == clipped["row"].nunique()
    picked = sum("picked" in s[0].split() for b in boxes for s in b["spans"])
    assert picked == len(clipped)


def test_two_runs_and_two_steps_side_by_side(runs, tmp_path):
    """Same seed, same first batch: the two runs' step-1 completions pair up token for token."""
    main(["--telemetry", str(runs["boost"]), "--compare", str(runs["equal"]), "--step", "1", "--shade", "weight",
          "--max_groups", "99", "--output", str(tmp_path / "runs")])
    boxes = page_boxes(tmp_path / "runs")
    assert len(boxes) == 32
    left, right = boxes[0::2], boxes[1::2]
    assert all([s[2] for s in a["spans"]] == [s[2] for s in b["spans"]] for a, b in zip(left, right))
    assert not all(s[3].endswith(",0.000)") for a in left for s in a["spans"])  # grpo_sg's weights are shaded
    assert all(s[3].endswith(",0.000)") for b in right for s in b["spans"])  # equal: w = 1 everywhere, no colour
    # one run, steps 1 and 2: the same batch (two iterations), its ratio moved
    main(["--telemetry", str(runs["equal"]), "--step", "1", "--compare_step", "2", "--shade", "ratio",
          "--max_groups", "99", "--output", str(tmp_path / "steps")])
    boxes = page_boxes(tmp_path / "steps")
    assert all([s[2] for s in a["spans"]] == [s[2] for s in b["spans"]] for a, b in zip(boxes[0::2], boxes[1::2]))


def test_truncated_and_foreign_files_are_refused_with_one_line(runs, tmp_path):
    good = runs["equal"] / "telemetry" / "telemetry_000001.parquet"
    truncated = tmp_path / "telemetry_000001.parquet"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(TelemetryFileError, match=rf"^telemetry file {re.escape(str(truncated))}: not a complete"):
        read_telemetry(truncated)
    import pandas as pd

    foreign = tmp_path / "foreign" / "telemetry_000003.parquet"
    foreign.parent.mkdir()
    pd.DataFrame({"step": [1], "prompt": ["x"], "advantage": [0.5]}).to_parquet(foreign)
    with pytest.raises(TelemetryFileError, match=rf"^telemetry file {re.escape(str(foreign))}: another schema"):
        read_telemetry(foreign)
    renamed = tmp_path / "old" / "telemetry_000001.parquet"
    renamed.parent.mkdir()
    shutil.copy(good, renamed)
    # the command line: one `error:` line naming the file
    done = subprocess.run([sys.executable, "-m", "sharpgrpo", "tokens", "--telemetry", str(truncated), "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(truncated) in lines[0]
    assert main(["--telemetry", str(renamed), "--output", str(tmp_path / "ok")])["step"] == 1


class Legend(HTMLParser):
    """The legend swatches (css background, label) of a page, in order."""

    def __init__(self):
        super().__init__()
        self.swatches, self._swatch = [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and "swatch" in (attrs.get("class") or "").split():
            self._swatch = [attrs.get("style", "").removeprefix("background:"), ""]

    def handle_data(self, data):
        if self._swatch is not None:
            self._swatch[1] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._swatch is not None:
            self.swatches.append(tuple(self._swatch))
            self._swatch = None


def legend_of(folder) -> list[tuple[str, str]]:
    parser = Legend()
    parser.feed((folder / "tokens.html").read_text())
    return parser.swatches


def drawn_values(frame, boxes, column) -> dict[str, list[float]]:
    """css background -> the values (from the telemetry file) of the tokens drawn in it, the page's spans aligned
    with the file's rows (row, then position)."""
    drawn: dict[str, list[float]] = {}
    rows = [frame[frame["row"] == row].sort_values("position") for row in sorted(frame["row"].unique())]
    assert len(rows) == len(boxes)
    for tokens, box in zip(rows, boxes, strict=True):
        assert len(box["spans"]) == len(tokens)
        for (_, _, _, style), value in zip(box["spans"], tokens[column].to_numpy(dtype=float), strict=True):
            drawn.setdefault(style.removeprefix("background:") or "none", []).append(float(value))
    return drawn


@pytest.mark.parametrize("column", ["factor", "weight", "entropy", "ratio", "advantage"])
def test_every_legend_swatch_is_a_colour_drawn_with_its_tokens_range_and_count(runs, tmp_path, column):
    """No swatch for a value no token has, no colour drawn without its swatch: each swatch's colour is drawn, its
    label gives the exact range (3 significant digits) and number of the tokens drawn in it."""
    main(["--telemetry", str(runs["boost"]), "--step", "1", "--shade", column, "--max_groups", "99",
          "--output", str(tmp_path)])  # fmt: skip
    frame, _ = read_telemetry(runs["boost"] / "telemetry" / "telemetry_000001.parquet")
    drawn = drawn_values(frame, page_boxes(tmp_path), column)
    legend = legend_of(tmp_path)
    assert sorted(css for css, _ in legend) == sorted(drawn)  # one swatch per colour drawn, and only those
    for css, label in legend:
        values = drawn[css]
        match = re.fullmatch(rf"{re.escape(column)} (\S+)(?: to (\S+))?(?: \((?:dropped|unchanged)\))?: (\d+)", label)
        assert match, label
        assert int(match.group(3)) == len(values)
        if css == "none":
            assert match.group(1) == "none" and all(math.isnan(v) for v in values)
            continue
        low, high = (float(f"{v:.4g}") for v in (min(values), max(values)))  # binned as the hover shows them
        assert match.group(1) == f"{low:.3g}" and (match.group(2) or match.group(1)) == f"{high:.3g}"
    if column == "entropy":  # real contrast: the entropies crowd, quantile bins still give light to dark
        alphas = sorted(float(css.rsplit(",", 1)[1].rstrip(")")) for css in drawn if css != "none")
        assert len(alphas) >= 4 and alphas[0] <= 0.5 and alphas[-1] == 1.0


def test_a_filter_that_matches_nothing_says_so(runs, tmp_path, capsys):
    frame, _ = read_telemetry(runs["boost"] / "telemetry" / "telemetry_000002.parquet")
    assert not (frame["weight"] == 0).any()  # GRPO-SG's weights are >= 1: no zero weight
    main(["--telemetry", str(runs["boost"]), "--filter", "zero_weight", "--output", str(tmp_path)])
    page = (tmp_path / "tokens.html").read_text()
    assert "Nothing to show: in the steps and groups picked, no token matches --filter zero_weight" in page
    assert ">nan<" not in page and page_boxes(tmp_path) == []
    assert "no token of step 2 matches --filter zero_weight" in capsys.readouterr().err


def test_each_side_is_shaded_by_its_own_column_and_byte_tokens_differ(runs, tmp_path):
    """Two columns side by side (an advantage strategy's factor, a weight strategy's weight): each side's colours and
    legend are its own column's; tokens that are bytes of no whole character show their ids, not one glyph."""
    from sharpgrpo.diagnostics.telemetry import select_tokens, shading, write_telemetry_page

    frame, meta = read_telemetry(runs["boost"] / "telemetry" / "telemetry_000001.parquet")
    frame = select_tokens(frame, max_groups=1)
    broken = frame.index[:2]
    frame.loc[broken, "token"] = "\ufffd"
    frame.loc[broken, "token_id"] = [201, 202]
    write_telemetry_page(tmp_path / "tokens.html", [("left", frame, meta), ("right", frame, meta)],
                         ["factor", "weight"], None)  # fmt: skip
    boxes = page_boxes(tmp_path)
    left, right = boxes[0::2], boxes[1::2]
    factor, weight = shading(frame["factor"].to_numpy(), "factor"), shading(frame["weight"].to_numpy(), "weight")
    rows = [frame[frame["row"] == row].sort_values("position") for row in sorted(frame["row"].unique())]
    for tokens, a, b in zip(rows, left, right, strict=True):
        assert [s[3] for s in a["spans"]] == [("background:" + factor.colour(v)) if factor.colour(v) else ""
                                              for v in tokens["factor"]]  # fmt: skip
        assert [s[3] for s in b["spans"]] == ["background:" + weight.colour(v) for v in tokens["weight"]]
    texts = [s[2] for s in left[0]["spans"][:2]]
    assert texts == ["<id 201>", "<id 202>"] and all("bytes" in s[0].split() for s in left[0]["spans"][:2])
    page = (tmp_path / "tokens.html").read_text()
    assert "<b>left</b> (factor): " in page and "<b>right</b> (weight): " in page
