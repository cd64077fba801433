"""A self-contained HTML page of completions, each token shaded by its strategy weight.

One file, no server and no external assets (inline CSS, no script): open it in any browser. Each completion is shown
with its reward columns and advantage; each token's background is blue below weight 1 (damped), orange above
(boosted), white at 1, with full colour at the strategy's weight bounds; hovering a token shows its probability and
weight. Written by ``sharpgrpo tokens`` as ``tokens.html``.
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


def factor_bounds(completions: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """The smallest and largest positive factor on the page, widened to include 1 (full colour at each end)."""
    positive = [f for e in completions if e["factors"] for f in e["factors"] if f > 1e-12]
    return min([1.0, *positive]), max([1.0, *positive])


def _hover(entry: dict[str, Any], t: int, strategies: Sequence[str]) -> str:
    parts = [f"p={entry['probs'][t]:.3f}"]
    if entry["factors"] is not None:
        parts.append(f"factor={entry['factors'][t]:.3f}")
        for own in entry["strategy_factors"]:
            if len(strategies) > 1:
                parts.append(f"{own['name']}={own['factors'][t]:.3f}")
            if own["scores"] is not None:
                parts.append(f"{own['name']} score={own['scores'][t]:.4g}")
    if entry.get("weights") is not None:
        parts.append(f"w={entry['weights'][t]:.3f}")
    return " ".join(parts)


def advantage_token_page(
    completions: Sequence[dict[str, Any]], strategies: Sequence[str], settings: dict[str, Any],
    meanings: dict[str, str], correct_rules: Sequence[str], weight_strategy: str | None = None,
    weight_bounds: tuple[float, float] | None = None,
) -> str:  # fmt: skip
    """The HTML text for advantage strategies. Each entry of ``completions``: ``prompt``, ``pieces``, ``probs``,
    ``advantage`` (A[i]), ``factors`` (A[i,t] / A[i] per token, None where A = 0), ``strategy_factors`` (per
    strategy: ``name``, its own ``factors`` and ``scores`` or None), ``weights`` (the weight strategy's, or None),
    ``correct`` and ``scores`` (the saved columns). The background is the factor; with ``weight_strategy`` a thick
    underline carries the token weight in the colours of :func:`shade`."""
    bounds = factor_bounds(completions)
    chain = " then ".join(strategies)
    values = sorted({bounds[0], 1.0, bounds[1]})
    legend = "".join(f'<span style="background:{factor_shade(f, bounds)}">f={f:.3g}</span>' for f in values)
    legend += f'<span style="background:{ZEROED}">f=0 (dropped)</span>'
    legend += f'<span style="background:{factor_shade(-1.0, bounds)}">f&lt;0 (sign flipped)</span>'
    if weight_strategy is not None:
        legend += "".join(
            f'<span style="border-bottom:4px solid {shade(w, weight_bounds)}">w={w:.2f}</span>'
            for w in sorted({weight_bounds[0], 1.0, weight_bounds[1]})
        )
    described = ", ".join(f"{k} {_number(v)}" for k, v in settings.items())
    meaning = "".join(f"<li><code>{html.escape(n)}</code>: {html.escape(meanings.get(n, ''))}</li>" for n in strategies)
    underline = (
        f" The thick underline is the token weight under <code>{html.escape(weight_strategy)}</code> (blue below 1, "
        f"orange above, full colour at its bounds [{weight_bounds[0]:.3g}, {weight_bounds[1]:.3g}])."
        if weight_strategy is not None else ""
    )  # fmt: skip
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Token advantages under {html.escape(chain)}</title><style>{STYLE}</style></head><body>",
        f"<h2>Token advantage factors under <code>{html.escape(chain)}</code></h2>",
        (
            f"<p>{len(completions)} completions; {html.escape(described)}. Each token is shaded by its factor "
            "f = A[i,t] / A[i], its token advantage over the completion's sequence advantage: blue below 1 (damped), "
            f"orange above 1 (boosted), full colour at the page's extremes [{bounds[0]:.3g}, {bounds[1]:.3g}]; grey "
            "at 0 (dropped), purple below 0. Completions with A = 0 have no factor and are not shaded. Correct "
            f"completions (positive set): {html.escape('; '.join(correct_rules))}, from the saved rewards. Hover a "
            f"token for its probability, factor and score.{underline}</p>"
        ),
        f"<ul>{meaning}</ul>",
        f'<p class="legend">{legend}</p>',
    ]
    for index, entry in enumerate(completions):
        scores = " &middot; ".join(
            f"{html.escape(str(name))} <b>{_number(value)}</b>" for name, value in entry["scores"].items()
        )
        tokens = []
        for t, piece in enumerate(entry["pieces"]):
            style = "" if entry["factors"] is None else f"background:{factor_shade(entry['factors'][t], bounds)};"
            if entry.get("weights") is not None:
                style += f"border-bottom:4px solid {shade(entry['weights'][t], weight_bounds)};"
            tokens.append(f'<span class="tok" style="{style}" title="{html.escape(_hover(entry, t, strategies))}">'
                          f"{html.escape(piece)}</span>")
        note = (" &middot; <i>A = 0: no token advantage to scale, not shaded</i>" if entry["factors"] is None
                else f" &middot; {'correct' if entry['correct'] else 'wrong'}")  # fmt: skip
        parts += completion_box(index, scores + note, entry["prompt"], "".join(tokens))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_advantage_token_page(path: str | Path, *args, **kwargs) -> Path:
    return write_page(path, advantage_token_page(*args, **kwargs))
