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


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The text each token adds to the decoded completion (a multi-byte character appears on the token completing
    it), so that the pieces join to exactly the decoded text."""
    pieces, previous = [], ""
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(list(ids[:end]), skip_special_tokens=False)
        pieces.append(text.removeprefix(previous) if text.startswith(previous) else text)
        previous = text
    return pieces


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
"""


def token_page(
    completions: Sequence[dict[str, Any]], strategy: str, bounds: tuple[float, float], settings: dict[str, Any]
) -> str:
    """The HTML text. Each entry of ``completions``: ``prompt``, ``pieces`` (token texts), ``probs``, ``weights``
    (lists of floats, one per token) and ``scores`` (reward columns and advantage, shown as given)."""
    lower, upper = bounds
    legend_weights = sorted({lower, (lower + 1.0) / 2, 1.0, (1.0 + upper) / 2, upper})
    legend = "".join(f'<span style="background:{shade(w, bounds)}">w={w:.2f}</span>' for w in legend_weights)
    described = ", ".join(f"{k} {_number(v)}" for k, v in settings.items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Token weights under {html.escape(strategy)}</title><style>{STYLE}</style></head><body>",
        f"<h2>Token weights under <code>{html.escape(strategy)}</code></h2>",
        (
            f"<p>{len(completions)} completions; {html.escape(described)}. Blue: weight below 1 (damped); orange: "
            f"above 1 (boosted); full colour at the weight bounds [{lower:.3g}, {upper:.3g}]. Hover a token for its "
            "probability and weight.</p>"
        ),
        f'<p class="legend">{legend}</p>',
    ]
    for index, entry in enumerate(completions):
        scores = " &middot; ".join(
            f"{html.escape(str(name))} <b>{_number(value)}</b>" for name, value in entry["scores"].items()
        )
        tokens = "".join(
            f'<span class="tok" style="background:{shade(w, bounds)}" title="p={p:.3f} w={w:.3f}">'
            f"{html.escape(piece)}</span>"
            for piece, p, w in zip(entry["pieces"], entry["probs"], entry["weights"], strict=True)
        )
        parts += completion_box(index, scores, entry["prompt"], tokens)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


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


def write_token_page(path: str | Path, *args, **kwargs) -> Path:
    return write_page(path, token_page(*args, **kwargs))


ZEROED = "rgba(150,150,150,0.55)"  # grey: factor 0, the token's advantage is dropped
FLIPPED_RGB = (140, 60, 170)  # purple: factor below 0, the token's advantage changes sign


def factor_shade(factor: float, bounds: tuple[float, float]) -> str:
    """CSS background for an advantage factor f = A[i,t] / A[i]: as :func:`shade` for f > 0 (blue damped, orange
    boosted, full colour at ``bounds``), grey at f = 0 (dropped), purple below 0 (sign flipped)."""
    if abs(factor) <= 1e-12:
        return ZEROED
    if factor < 0:
        return f"rgba({FLIPPED_RGB[0]},{FLIPPED_RGB[1]},{FLIPPED_RGB[2]},{min(1.0, 0.35 + abs(factor)):.3f})"
    return shade(factor, bounds)
