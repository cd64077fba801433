"""A self-contained HTML page of completions, each token shaded by its strategy weight.

One file, no server and no external assets (inline CSS, no script): open it in any browser. Each completion is shown
with its reward columns and advantage; each token's background is blue below weight 1 (damped), orange above
(boosted), white at 1, with full colour at the strategy's weight bounds; hovering a token shows its probability and
weight. Written by ``sharpgrpo tokens`` as ``tokens.html``; the colours are shared with the telemetry page
(``sharpgrpo.diagnostics.telemetry``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DAMPED_RGB = (49, 130, 189)  # blue: weight below 1
BOOSTED_RGB = (230, 120, 20)  # orange: weight above 1
ZEROED = "rgba(150,150,150,0.55)"  # grey: weight or factor 0, the token's gradient or advantage is dropped
FLIPPED_RGB = (140, 60, 170)  # purple: factor below 0, the token's advantage changes sign
LEVEL_RGB = (60, 160, 90)  # green: a level column (p, entropy, logp, ...)


REPLACEMENT = "\ufffd"  # what a decoder prints for bytes that are not (yet) a whole UTF-8 character


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The text each token adds to the decoded completion, so that the pieces join to the decoded text: a multi-byte
    character appears on the token completing it (the tokens holding its first bytes add nothing). Bytes that never
    become a character (a stray byte, or a character cut off at the end) show as ``<0xNN>`` (:func:`byte_label`), on
    each token holding them, instead of the replacement glyph every such token would share."""
    pieces: list[str] = []
    emitted, pending = "", []  # pending: tokens whose bytes wait for the rest of their character
    for index in range(len(ids)):
        text = tokenizer.decode(list(ids[: index + 1]), skip_special_tokens=False)
        last = index == len(ids) - 1
        stable = text if last else text.rstrip(REPLACEMENT)  # an unfinished character may still complete
        piece = stable[len(emitted):] if stable.startswith(emitted) else stable
        emitted = stable if stable.startswith(emitted) else emitted + piece
        if REPLACEMENT in piece:  # bytes that never became a character: each token shows its own bytes
            for earlier in pending:
                pieces[earlier] = byte_label(tokenizer, ids[earlier])
            own = REPLACEMENT in tokenizer.decode([ids[index]], skip_special_tokens=False)
            piece = (byte_label(tokenizer, ids[index]) if own else "") + piece.replace(REPLACEMENT, "")
            pending = []
        elif piece == "" and REPLACEMENT in text:
            pending.append(index)
        else:
            pending = []
        pieces.append(piece)
    return pieces


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed (``bytes_to_unicode`` of openai/gpt-2 ``src/encoder.py``, which byte-level
    BPE tokenizers such as Qwen2's and the tiny model's use): each printable stand-in character -> its byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))  # fmt: skip
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


def byte_label(tokenizer, token_id: int) -> str:
    """``<0xNN>`` for each byte of a token that is no whole character: a byte-fallback token's own name
    (SentencePiece's ``<0xE2>``), or the bytes of a byte-level BPE token (GPT-2's byte alphabet); else ``<id N>``."""
    import re

    name = tokenizer.convert_ids_to_tokens(int(token_id))
    if isinstance(name, str) and re.fullmatch(r"(<0x[0-9A-Fa-f]{2}>)+", name):
        return re.sub(r"<0x([0-9A-Fa-f]{2})>", lambda m: f"<0x{m.group(1).upper()}>", name)
    decoder = _byte_decoder()
    if isinstance(name, str) and name and all(char in decoder for char in name):
        return "".join(f"<0x{decoder[char]:02X}>" for char in name)
    return f"<id {int(token_id)}>"


# ------------------------------------------------------------------------------------------------------------------
# Shading: every token's colour is one of a few bins, and the legend lists exactly the bins drawn
# ------------------------------------------------------------------------------------------------------------------
NEUTRAL = "rgba(230,120,20,0.000)"  # no colour: the value leaves the token unchanged (weight 1, factor 1, 0 signed)
LEVEL_BINS = 5  # quantile bins of a level column (entropy, p, ...): contrast wherever the values crowd
SIDE_BINS = 3  # quantile bins on each side of the neutral value


def _quantile_edges(values, bins: int) -> list[float]:
    """Interior edges splitting ``values`` into at most ``bins`` groups of about equal size (quantiles)."""
    import numpy as np

    if len(values) == 0:
        return []
    values = np.asarray(values, dtype=np.float64)
    edges = np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1]))
    return [float(e) for e in edges if e < values.max()]  # a value at an edge goes below it: the top bin is never empty


def _bin_index(value: float, edges: Sequence[float]) -> int:
    import bisect

    return bisect.bisect_left(list(edges), value)


def _rounded(value) -> float:
    return float(f"{float(value):.4g}")


class Shading:
    """The colours of one page (or one side of it) for ``column`` over the ``values`` drawn (one per token).

    Kinds (how the column reads): ``around_one`` (a weight: blue below 1, orange above, none at 1, grey at 0),
    ``factor`` (A[i,t]/A[i]: as ``around_one``, grey at 0 = dropped, purple below 0 = sign flipped), ``signed``
    (blue below 0, orange above, none at 0) and ``level`` (green). Each side of the neutral value is split into
    quantile bins (a level column into :data:`LEVEL_BINS`), darker away from neutral, so that crowded values still
    differ; every token gets its bin's colour, and :meth:`legend` lists exactly the bins some token is in, each with
    the range of its tokens' values and their number (no swatch for a value no token has, none missing)."""

    def __init__(self, values, column: str, kind: str):
        import math

        self.column, self.kind = column, kind
        # binned at the 4 significant digits a token's hover shows: values apart by float rounding (a THR factor
        # 1 - p computed as A[i,t] / A[i] in float32) are one value, not two bins
        finite = [_rounded(v) for v in values if v is not None and math.isfinite(float(v))]
        self.missing = sum(1 for v in values if v is None or not math.isfinite(float(v)))
        self.edges = {side: _quantile_edges([v for v in finite if self._side(v) == side], LEVEL_BINS if side ==
                                            "level" else SIDE_BINS) for side in ("below", "above", "flipped", "level")}  # fmt: skip
        self.bins: dict[tuple[str, int], list[float]] = {}
        for value in finite:
            self.bins.setdefault(self._key(value), []).append(value)

    def _side(self, value: float) -> str:
        if self.kind == "level":
            return "level"
        if self.kind in ("factor", "around_one") and abs(value) <= 1e-12:
            return "zero"
        neutral = 0.0 if self.kind == "signed" else 1.0
        if abs(value - neutral) <= 1e-9:
            return "neutral"
        if self.kind == "factor" and value < 0:
            return "flipped"
        return "below" if value < neutral else "above"

    def _key(self, value: float) -> tuple[str, int]:
        side = self._side(value)
        if side in ("zero", "neutral"):
            return side, 0
        edges = self.edges[side]
        index = _bin_index(value, edges)
        # below the neutral value, the bins far from it (low values) are the dark ones
        return side, (len(edges) - index if side in ("below", "flipped") else index)

    def _css(self, key: tuple[str, int]) -> str:
        side, index = key
        if side == "zero":
            return ZEROED
        if side == "neutral":
            return NEUTRAL
        count = len(self.edges[side]) + 1
        alpha = 0.2 + 0.8 * (index + 1) / count
        rgb = {"below": DAMPED_RGB, "above": BOOSTED_RGB, "flipped": FLIPPED_RGB, "level": LEVEL_RGB}[side]
        return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{alpha:.3f})"

    def colour(self, value) -> str:
        """CSS background of a token with ``value`` ("" for a missing value: no colour, the legend says so)."""
        import math

        if value is None or not math.isfinite(float(value)):
            return ""
        return self._css(self._key(_rounded(value)))

    def entries(self) -> list[tuple[str, str, int]]:
        """``(label, css, tokens)`` per bin drawn, in value order, then the tokens without a value."""
        notes = {"zero": " (dropped)" if self.kind == "factor" else "", "neutral": " (unchanged)"}
        rows = []
        for key, values in sorted(self.bins.items(), key=lambda item: min(item[1])):
            low, high = min(values), max(values)
            shown = f"{low:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g} to {high:.3g}"
            rows.append((f"{self.column} {shown}{notes.get(key[0], '')}: {len(values)}", self._css(key), len(values)))
        if self.missing:
            rows.append((f"{self.column} none: {self.missing}", "", self.missing))
        return rows

    def legend(self) -> str:
        """The swatches, one per bin drawn (``<span class="swatch">``, the bin's colour and its tokens' range)."""
        return "".join(f'<span class="swatch{"" if css else " none"}" style="background:{css or "none"}">'
                       f"{html.escape(label)}</span>" for label, css, _ in self.entries())  # fmt: skip


def shade(weight: float, bounds: tuple[float, float]) -> str:
    """CSS background for ``weight``: transparent at 1, full colour at the bound on its side (or 0.5 away)."""
    lower, upper = bounds
    if weight >= 1.0:
        span, rgb = max(upper - 1.0, 0.0) or 0.5, BOOSTED_RGB
    else:
        span, rgb = max(1.0 - lower, 0.0) or 0.5, DAMPED_RGB
    alpha = min(1.0, abs(weight - 1.0) / span)
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{alpha:.3f})"


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in prompt if isinstance(m, dict))


def _number(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else html.escape(str(value))


STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; }
.completion { border: 1px solid #ccc; border-radius: 6px; margin: 12px 0; padding: 8px 12px; }
.scores { font-size: 13px; color: #444; margin-bottom: 6px; }
.text { font-family: monospace; font-size: 14px; white-space: pre-wrap; line-height: 1.7; }
.tok { border-radius: 2px; }
details { font-size: 12px; color: #555; margin-bottom: 6px; }
details pre { white-space: pre-wrap; }
.legend span { display: inline-block; padding: 2px 8px; margin-right: 4px; font-family: monospace; }
.legend .none { border: 1px dashed #999; }
.pages { margin: 8px 0; font-size: 13px; }
.pages a, .pages b { margin-right: 6px; }
.tok.bytes { border: 1px dotted #777; font-size: 11px; }
"""


PAGE_SIZE = 200  # completions per page: a run's 3,200 logged completions make 16 pages, not one 3.7 MB file


def page_name(path: str | Path, number: int) -> str:
    """File name of page ``number`` (1-based): ``tokens.html``, ``tokens_2.html``, ..."""
    path = Path(path)
    return path.name if number == 1 else f"{path.stem}_{number}{path.suffix}"


def _page_links(path: str | Path, number: int, pages: int) -> str:
    if pages == 1:
        return ""
    links = [f"<b>{n}</b>" if n == number else f'<a href="{html.escape(page_name(path, n))}">{n}</a>'
             for n in range(1, pages + 1)]  # fmt: skip
    return f'<p class="pages">Page {number} of {pages}: {"".join(links)}</p>'


def token_page(
    completions: Sequence[dict[str, Any]], strategy: str, bounds: tuple[float, float], settings: dict[str, Any],
    page: tuple[int, int, int, str | Path] | None = None,
) -> str:  # fmt: skip
    """The HTML text. Each entry of ``completions``: ``prompt``, ``pieces`` (token texts), ``probs``, ``weights``
    (lists of floats, one per token) and ``scores`` (reward columns and advantage, shown as given). ``page``:
    ``(number, pages, first index, path)`` when the completions are one page of several."""
    lower, upper = bounds
    shading = Shading([w for entry in completions for w in entry["weights"]], "w", "around_one")
    described = ", ".join(f"{k} {_number(v)}" for k, v in settings.items())
    number, pages, first, path = page or (1, 1, 0, "tokens.html")
    links = _page_links(path, number, pages)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Token weights under {html.escape(strategy)}</title><style>{STYLE}</style></head><body>",
        f"<h2>Token weights under <code>{html.escape(strategy)}</code></h2>",
        (
            f"<p>{len(completions)} completions{f' on this page (#{first} to #{first + len(completions) - 1})' if pages > 1 else ''}; "
            f"{html.escape(described)}. Blue: weight below 1 (damped); orange: above 1 (boosted); no colour at 1; the "
            f"strategy's weight bounds are [{lower:.3g}, {upper:.3g}]. Each side of 1 is split into bins of about "
            "equal size, darker away from 1; the legend lists every bin drawn with its weights' range and its number "
            "of tokens. Hover a token for its probability and weight; a dotted box shows the bytes of a token that "
            "is no whole character.</p>"
        ),
        f'<p class="legend">{shading.legend()}</p>',
        links,
    ]
    for index, entry in enumerate(completions):
        scores = " &middot; ".join(
            f"{html.escape(str(name))} <b>{_number(value)}</b>" for name, value in entry["scores"].items()
        )
        tokens = "".join(
            f'<span class="tok{" bytes" if _is_byte_label(piece) else ""}" style="background:{shading.colour(w)}" '
            f'title="p={p:.3f} w={w:.3f}">{html.escape(piece)}</span>'
            for piece, p, w in zip(entry["pieces"], entry["probs"], entry["weights"], strict=True)
        )
        parts += completion_box(first + index, scores, entry["prompt"], tokens)
    parts += [links, "</body></html>"]
    return "\n".join(parts) + "\n"


def _is_byte_label(piece: str) -> bool:
    import re

    return bool(re.fullmatch(r"(<0x[0-9A-F]{2}>)+|<id \d+>", piece))


def completion_box(index: int, header: str, prompt: Any, tokens: str) -> list[str]:
    """One completion's box: ``#index`` with ``header`` (HTML), the folded prompt, the shaded ``tokens`` (HTML)."""
    return [
        '<div class="completion">',
        f'<div class="scores">#{index} &middot; {header}</div>',
        f"<details><summary>prompt</summary><pre>{html.escape(_prompt_text(prompt))}</pre></details>",
        f'<div class="text">{tokens}</div>',
        "</div>",
    ]


def write_page(path: str | Path, page: str) -> Path:
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


def write_token_page(
    path: str | Path, completions: Sequence[dict[str, Any]], strategy: str, bounds: tuple[float, float],
    settings: dict[str, Any], page_size: int = PAGE_SIZE,
) -> Path:  # fmt: skip
    """The token page, :data:`PAGE_SIZE` completions a page: ``path`` is the first page, the others beside it
    (``tokens_2.html``, ...), each linking to all. Returns ``path``."""
    path = Path(path)
    pages = max(1, -(-len(completions) // page_size))
    for stale in path.parent.glob(f"{path.stem}_*{path.suffix}"):  # pages of an earlier, longer page set
        if stale.stem.removeprefix(f"{path.stem}_").isdigit():
            stale.unlink()
    for number in range(1, pages + 1):
        first = (number - 1) * page_size
        chunk = completions[first : first + page_size]
        write_page(path.parent / page_name(path, number),
                   token_page(chunk, strategy, bounds, settings, page=(number, pages, first, path)))  # fmt: skip
    return path




def factor_shade(factor: float, bounds: tuple[float, float]) -> str:
    """CSS background for an advantage factor f = A[i,t] / A[i]: as :func:`shade` for f > 0 (blue damped, orange
    boosted, full colour at ``bounds``), grey at f = 0 (dropped), purple below 0 (sign flipped)."""
    if abs(factor) <= 1e-12:
        return ZEROED
    if factor < 0:
        return f"rgba({FLIPPED_RGB[0]},{FLIPPED_RGB[1]},{FLIPPED_RGB[2]},{min(1.0, 0.35 + abs(factor)):.3f})"
    return shade(factor, bounds)
