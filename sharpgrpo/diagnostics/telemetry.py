"""Reading per-token telemetry files (`sharpgrpo.training.telemetry.recorder`) and the token page built on them.

No model and no forward: every value on the page is a column the trainer wrote from inside its loss, so the page
shows what was trained on, for every strategy, a user-registered one included. ``sharpgrpo tokens --telemetry``
(``sharpgrpo.cli.tokens``) is the command line.

* ``read_telemetry(path)``: one file as a pandas frame plus its metadata, refused with one line naming the file when
  it is truncated, not parquet or of another schema, or another run's (``check_run_of``: its metadata against the
  run folder it sits in); derived columns ``p`` = exp(logp) and ``factor`` = A[i,t] / A[i] (advantage over TRL's
  sequence advantage; NaN where A[i] = 0).
* ``select_tokens``: pick groups (prompts) and mark the tokens a filter names (clipped, masked, zero_weight).
* ``telemetry_page``: each completion's tokens shaded by any numeric column, one or two runs side by side (a
  rollout correction's columns and the what-if view of ``sharpgrpo.diagnostics.correction_what_if`` included).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sharpgrpo.diagnostics.token_page import REPLACEMENT, STYLE, Shading, _prompt_text, write_page
from sharpgrpo.training.telemetry.recorder import FOLDER, METADATA_KEY, REQUIRED, SCHEMA_VERSION, file_metadata

FILTERS = {
    "clipped": "a clip bound is active (clip_low or clip_high)",
    "masked": "out of the loss (mask = 0) or out of TRL's entropy mask",
    "zero_weight": "weight w = 0",
}
# Columns shaded around 1 (blue below, orange above, as the weight page), and A[i,t] / A[i] (grey at 0, purple < 0).
AROUND_ONE = ("weight", "ratio", "surrogate_ratio", "is_weight")
# Read by a name's last part too (``rollout_correction/is_weight``, ``what_if/change``): a factor on the policy term
# around 1; a signed difference around 0.
AROUND_ONE_LAST = ("is_weight", "token_mask", "run_token_mask")
SIGNED_LAST = ("mismatch_k1", "change")
HOVER = ("p", "weight", "advantage", "advantage_trl", "factor", "ratio", "entropy", "token_loss", "loss_contribution")


class TelemetryFileError(ValueError):
    """A telemetry file that cannot be read: one line naming it."""

    names_itself = True


def telemetry_files(path: str | Path) -> dict[int, Path]:
    """``{step: file}`` of a telemetry folder, a run folder (its ``telemetry/``) or one file."""
    path = Path(path)
    if path.is_file():
        return {_step_of(path): path}
    folder = path / "telemetry" if (path / "telemetry").is_dir() else path
    files = sorted(folder.glob("telemetry_*.parquet")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"No telemetry_*.parquet in {path}: train with `token_telemetry: true` (files under output_dir/telemetry/)."
        )
    return {_step_of(f): f for f in files}


def _step_of(path: Path) -> int:
    try:
        return int(path.stem.rsplit("_", 1)[-1])
    except ValueError:
        return -1


def read_telemetry(path: str | Path):
    """``(frame, metadata)`` of one telemetry file; ``TelemetryFileError`` (one line naming the file) when it is not
    a complete parquet file or not a telemetry file of this schema version."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        reason = " ".join(str(error).split())[:160]
        raise TelemetryFileError(f"telemetry file {path}: not a complete parquet file (truncated?): {reason}") from None
    raw = (table.schema.metadata or {}).get(METADATA_KEY.encode())
    if raw is None:
        raise TelemetryFileError(f"telemetry file {path}: another schema (no {METADATA_KEY!r} metadata); "
                                 "expected a file written by token_telemetry")
    meta = json.loads(raw)
    if meta.get("version") != SCHEMA_VERSION:
        raise TelemetryFileError(f"telemetry file {path}: schema version {meta.get('version')}, this sharpgrpo reads "
                                 f"version {SCHEMA_VERSION}")
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise TelemetryFileError(f"telemetry file {path}: another schema, columns missing: {', '.join(missing)}")
    run = check_run_of(path, meta)
    meta["run_folder"] = None if run is None else str(run)
    frame = table.to_pandas()
    frame["p"] = np.exp(frame["logp"].astype(np.float64))
    trl = frame["advantage_trl"].astype(np.float64)
    frame["factor"] = np.where(trl != 0, frame["advantage"] / trl.where(trl != 0, 1.0), np.nan)
    return frame, meta


# What a telemetry file's metadata says about the run that wrote it, all made from the run's arguments
# (recorder.file_metadata): a file whose values differ from its run folder's is another run's.
RUN_KEYS = ("output_dir", "strategies", "strategy_params", "loss_type", "weight_placement",
            "importance_sampling_level", "epsilon_low", "epsilon_high", "beta", "temperature", "num_generations", "seed")


def run_folder_of(path: str | Path) -> Path | None:
    """The training run folder a telemetry file sits in (``RUN/telemetry/telemetry_<step>.parquet`` with the run's
    ``training_args.json`` in ``RUN``), or None for a file outside one."""
    from sharpgrpo.run.lifecycle import TRAINING_ARGS_JSON

    folder = Path(path).resolve().parent
    if folder.name != FOLDER or not (folder.parent / TRAINING_ARGS_JSON).is_file():
        return None
    return folder.parent


def check_run_of(path: str | Path, meta: dict[str, Any]) -> Path | None:
    """Refuse, in one line naming the file and the run folder, a telemetry file that is not the run's it sits in (a
    file copied from another run is otherwise shown as this run's): its step must be the one its name says, within
    the run's ``max_steps``, and the settings its metadata records (``recorder.file_metadata``; :data:`RUN_KEYS`:
    the run folder's name, strategies and their parameters, loss, clip range, beta, temperature, group size, seed)
    must be the run's own, as ``file_metadata`` makes them from the run's ``training_args.json``. Returns the run
    folder, or None for a file outside a run folder (then only the file's own schema and step are checked; which run
    it belongs to is not)."""
    from sharpgrpo.run.lifecycle import TRAINING_ARGS_JSON

    path = Path(path)
    named = _step_of(path)
    if named >= 0 and meta.get("step") != named:
        raise TelemetryFileError(f"telemetry file {path}: its metadata says step {meta.get('step')}, its name step "
                                 f"{named}; a renamed file of another step is not shown as this one")
    run = run_folder_of(path)
    if run is None:
        return None
    try:
        saved = json.loads((run / TRAINING_ARGS_JSON).read_text(encoding="utf-8"))
        expected = file_metadata(_Args(saved), meta.get("step"), [])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # not a run's arguments file: the run is not known
    differ = [key for key in RUN_KEYS if key in meta and key in expected and _json(meta[key]) != _json(expected[key])]
    max_steps = saved.get("max_steps")
    if isinstance(max_steps, int) and max_steps > 0 and isinstance(meta.get("step"), int) and meta["step"] > max_steps:
        differ.append("step")
        expected["step"] = f"<= max_steps={max_steps}"
    if differ:
        shown = "; ".join(f"{key}={_json(meta[key])} in the file, {_json(expected[key])} in the run"
                          for key in differ[:3])
        raise TelemetryFileError(
            f"telemetry file {path} is not the run's in {run} (another run's file, copied?): {shown} (the run's "
            f"{TRAINING_ARGS_JSON}); read it from its own run folder"
        )
    return run


class _Args:
    """A run's saved arguments (``training_args.json``) read as the config ``file_metadata`` takes."""

    def __init__(self, saved: dict[str, Any]):
        self.__dict__.update(saved)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def filter_mask(frame, name: str | None):
    """Boolean Series: the tokens ``name`` (one of ``FILTERS``) picks; all True without a filter."""
    if name is None:
        return frame["row"] >= 0
    if name == "clipped":
        return frame["clip_low"].astype(bool) | frame["clip_high"].astype(bool)
    if name == "masked":
        kept = frame["mask"] == 1
        if "entropy_mask" in frame:
            kept &= frame["entropy_mask"] == 1
        return ~kept
    if name == "zero_weight":
        return frame["weight"] == 0
    raise ValueError(f"--filter {name!r}: expected one of {', '.join(FILTERS)}")


def select_tokens(frame, *, groups: Sequence[int] | None = None, token_filter: str | None = None, max_groups=None):
    """The frame restricted to the picked ``groups`` (``prompt_index`` values; default all, at most ``max_groups``)
    and, with ``token_filter``, to the completions holding a token it picks; column ``picked`` marks those tokens."""
    frame = frame.copy()
    frame["picked"] = filter_mask(frame, token_filter).to_numpy() if token_filter else False
    if groups:
        unknown = sorted(set(groups) - set(frame["prompt_index"].unique().tolist()))
        if unknown:
            raise ValueError(f"--group {unknown[0]}: this step has groups 0-{int(frame['prompt_index'].max())}")
        frame = frame[frame["prompt_index"].isin(list(groups))]
    if token_filter:
        rows = frame.loc[frame["picked"], "row"].unique()
        frame = frame[frame["row"].isin(rows)]
    if max_groups is not None:
        keep = sorted(frame["prompt_index"].unique())[:max_groups]
        frame = frame[frame["prompt_index"].isin(keep)]
    return frame


def summary(frame) -> dict[str, Any]:
    """Counts and means over the loss tokens (mask = 1) of a frame."""
    kept = frame[frame["mask"] == 1]
    n = max(len(kept), 1)
    return {
        "completions": int(frame["row"].nunique()),
        "tokens": len(frame),
        "loss_tokens": len(kept),
        "clip_low": float(kept["clip_low"].sum() / n),
        "clip_high": float(kept["clip_high"].sum() / n),
        "mean_weight": float(kept["weight"].mean()) if len(kept) else math.nan,
        "zero_weight": float((kept["weight"] == 0).sum() / n),
        "mean_abs_advantage": float(kept["advantage"].abs().mean()) if len(kept) else math.nan,
        "loss": float(frame["loss_contribution"].sum()),
    }


def token_ranking(frame, top: int = 100, min_count: int = 5) -> tuple[dict[str, list[dict]], dict[str, float]]:
    """GRPO-SG App. C.3's table from the telemetry: the ``top`` highest- and lowest-mean-probability tokens among
    those seen at least ``min_count`` times in the loss, each with its mean weight as trained (the entries of
    ``sharpgrpo.diagnostics.tokens.rank_tokens``, whose ``tokens_markdown`` prints them), and the overall means."""
    from sharpgrpo.diagnostics.tokens import display_token

    kept = frame[frame["mask"] == 1]
    stats = kept.groupby("token_id").agg(count=("p", "size"), mean_prob=("p", "mean"), mean_weight=("weight", "mean"),
                                         token=("token", "first"))
    stats = stats[stats["count"] >= max(1, min_count)].reset_index()
    n_high = min(top, math.ceil(len(stats) / 2))
    n_low = min(top, len(stats) - n_high)
    high = stats.sort_values(["mean_prob", "count", "token_id"], ascending=[False, False, True]).head(n_high)
    low = stats.sort_values(["mean_prob", "count", "token_id"], ascending=[True, False, True]).head(n_low)

    def entries(table):
        return [{"token_id": int(r.token_id), "token": display_token(r.token), "count": int(r.count),
                 "mean_prob": float(r.mean_prob), "mean_weight": float(r.mean_weight)} for r in table.itertuples()]

    overall = {"tokens": len(kept), "mean_prob": float(kept["p"].mean()) if len(kept) else math.nan,
               "mean_weight": float(kept["weight"].mean()) if len(kept) else math.nan}
    return {"high": entries(high), "low": entries(low)}, overall


def column_kind(column: str) -> str:
    """How a column is shaded: ``factor``, ``around_one`` (w-like), ``signed`` (diverging at 0) or ``level``."""
    if column == "factor":
        return "factor"
    head, last = column.split("/")[0], column.split("/")[-1]
    if head in AROUND_ONE or ("/" in column and last in AROUND_ONE_LAST):
        return "around_one"
    if head in ("advantage", "advantage_trl", "token_loss", "loss_contribution", "kl", "reward") or (
            "/" in column and last in SIGNED_LAST):
        return "signed"
    return "level"


def shading(values, column: str) -> Shading:
    """The page's colours for ``column`` over the ``values`` drawn (:class:`sharpgrpo.diagnostics.token_page.Shading`:
    quantile bins on each side of the neutral value, a legend of exactly the bins drawn)."""
    return Shading(np.asarray(values, dtype=np.float64).tolist(), column, column_kind(column))


def _hover(token, columns: Sequence[str]) -> str:
    parts = []
    for name in columns:
        value = token.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        parts.append(f"{name}={value:.4g}" if isinstance(value, (float, np.floating)) else f"{name}={value}")
    flags = [flag for flag in ("clip_low", "clip_high") if token.get(flag)]
    if token.get("mask") == 0:
        flags.append("masked")
    return " ".join(parts + flags)


def completions(frame, column: str) -> list[dict[str, Any]]:
    """One entry per completion (global order): prompt, group, rewards, sequence values and its tokens."""
    hover = [c for c in dict.fromkeys([column, *HOVER]) if c in frame]
    hover += [c for c in frame.columns if c.startswith(("advantage/", "weight/", "what_if/", "routing/"))
              and c not in hover]
    hover += [c for c in frame.columns if _declared_column(c) and c not in hover]
    if any(c.startswith("what_if/") or _declared_column(c) for c in hover):  # a correction's inputs beside it
        hover += [c for c in ("old_logp", "sampling_logp") if c in frame and c not in hover]
    entries = []
    for row, rows in frame.groupby("row", sort=True):
        first = rows.iloc[0]
        kept = rows[rows["mask"] == 1]
        rewards = {c: float(first[c]) for c in frame.columns if c.startswith("reward/")}
        entries.append({
            "row": int(row), "prompt_index": int(first["prompt_index"]),
            "completion_index": int(first["completion_index"]), "prompt": first.get("prompt", ""),
            "rewards": rewards, "reward": float(first.get("reward", math.nan)),
            "advantage_trl": float(first["advantage_trl"]),
            "advantage": float(kept["advantage"].mean()) if len(kept) else math.nan,
            "tokens": [
                {**{c: _plain(t[c]) for c in hover}, "token": t["token"], "token_id": int(t["token_id"]),
                 "picked": bool(t["picked"]),
                 "mask": int(t["mask"]), "clip_low": bool(t["clip_low"]), "clip_high": bool(t["clip_high"]),
                 "position": int(t["position"])}
                for t in rows.to_dict("records")
            ],
        })
    return entries


def _declared_column(name: str) -> bool:
    """A loss strategy's declared per-token diagnostic (``TokenLossStrategy.columns``), e.g. rollout_correction's."""
    from sharpgrpo.strategies import STRATEGIES

    prefix, _, term = name.partition("/")
    return prefix in STRATEGIES and term in getattr(STRATEGIES.get(prefix), "columns", {})


def _plain(value):
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer, int, np.bool_)):
        return int(value)
    return value


EXTRA_STYLE = """
.tok.picked { outline: 2px solid #d62728; }
.tok.clip { text-decoration: underline wavy #d62728; }
.tok.off { color: #999; }
.empty { border: 1px solid #d62728; padding: 8px 12px; color: #a00; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.pair h3 { font-size: 14px; margin: 4px 0; }
table.summary { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
table.summary td, table.summary th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
"""


def _tokens_html(entry: dict[str, Any], column: str, colour) -> str:
    spans = []
    hover_columns = [k for k in entry["tokens"][0] if k not in ("token", "token_id", "picked", "mask", "clip_low",
                                                                 "clip_high", "position")] if entry["tokens"] else []
    for token in entry["tokens"]:
        text = token["token"]
        undecodable = REPLACEMENT in text  # bytes of an unfinished character: its id tells such tokens apart
        classes = ["tok"] + (["picked"] if token["picked"] else []) + (
            ["clip"] if token["clip_low"] or token["clip_high"] else []) + (["off"] if token["mask"] == 0 else []) + (
            ["bytes"] if undecodable else [])
        value = token.get(column)
        style = colour.colour(value if value is not None else math.nan)
        title = _hover(token, hover_columns) + (f" token_id={token['token_id']} (bytes of no whole character)"
                                                if undecodable else "")  # fmt: skip
        shown = f"<id {token['token_id']}>" if undecodable else text
        spans.append(f'<span class="{" ".join(classes)}" style="{("background:" + style) if style else ""}" '
                     f'title="{html.escape(title)}">{html.escape(shown)}</span>')
    return "".join(spans)


def _box(entry: dict[str, Any], column: str, colour) -> list[str]:
    rewards = " &middot; ".join(f"{html.escape(k.removeprefix('reward/'))} <b>{v:.3g}</b>"
                                for k, v in entry["rewards"].items())
    header = (f"#{entry['row']} &middot; group {entry['prompt_index']}, completion {entry['completion_index']} "
              f"&middot; {rewards} &middot; A (trained, mean) <b>{entry['advantage']:.3f}</b> &middot; "
              f"TRL's A <b>{entry['advantage_trl']:.3f}</b>")
    return [
        '<div class="completion">',
        f'<div class="scores">{header}</div>',
        f"<details><summary>prompt</summary><pre>{html.escape(_prompt_text(entry['prompt']))}</pre></details>",
        f'<div class="text">{_tokens_html(entry, column, colour)}</div>',
        "</div>",
    ]


def _summary_table(summaries: dict[str, dict[str, Any]]) -> str:
    names = ["completions", "loss_tokens", "clip_low", "clip_high", "mean_weight", "zero_weight",
             "mean_abs_advantage", "loss"]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = "".join(
        f"<tr><th>{html.escape(label)}</th>" + "".join(
            (f"<td>{s[n]:.4g}</td>" if math.isfinite(s[n]) else "<td>-</td>") if isinstance(s[n], float)
            else f"<td>{s[n]}</td>" for n in names) + "</tr>"
        for label, s in summaries.items()
    )
    return f'<table class="summary"><tr><th></th>{head}</tr>{rows}</table>'


def describe(meta: dict[str, Any]) -> str:
    keys = ("strategies", "loss_type", "weight_placement", "epsilon_low", "epsilon_high", "beta", "temperature")
    return ", ".join(f"{k} {meta[k]}" for k in keys if k in meta)


def telemetry_page(runs: Sequence[tuple[str, Any, dict[str, Any]]], column: str | Sequence[str],
                   token_filter: str | None, notes: str = "") -> str:  # fmt: skip
    """The HTML text: ``runs`` is one or two ``(label, selected frame, metadata)``; two are shown side by side,
    completion by completion (matched by prompt and completion index). ``column`` shades every run, or is one column
    per run (each run shaded by its own strategy's column: ``weight`` beside ``factor``); runs shaded by the same
    column share one colour scale and legend. ``notes``: HTML shown under the summary (the what-if's paragraph)."""
    columns = [column] * len(runs) if isinstance(column, str) else list(column)
    for (_, frame, _), name in zip(runs, columns, strict=True):
        if name not in frame:
            available = sorted(c for c in frame.columns if frame[c].dtype.kind in "fiub")
            from sharpgrpo.validation import did_you_mean

            raise ValueError(f"--shade {name!r}: not a column of the telemetry{did_you_mean(name, available)}; "
                             f"numeric columns: {', '.join(available)}")  # fmt: skip
    shared = len(set(columns)) == 1
    if shared:
        one = shading(np.concatenate([f[columns[0]].to_numpy(dtype=np.float64) for _, f, _ in runs]), columns[0])
        colours = [one] * len(runs)
    else:
        colours = [shading(f[c].to_numpy(dtype=np.float64), c) for (_, f, _), c in zip(runs, columns, strict=True)]
    title = " vs ".join(label for label, _, _ in runs)
    filter_text = f" Outlined in red: tokens where {FILTERS[token_filter]} (only completions holding one are shown)." \
        if token_filter else ""
    heading = " and ".join(dict.fromkeys(columns))
    if shared:
        legends = f'<p class="legend">{colours[0].legend()}</p>'
    else:
        legends = "".join(f'<p class="legend"><b>{html.escape(label)}</b> ({html.escape(c)}): {shade.legend()}</p>'
                          for (label, _, _), c, shade in zip(runs, columns, colours, strict=True))  # fmt: skip
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Token telemetry: {html.escape(title)}</title><style>{STYLE}{EXTRA_STYLE}</style></head><body>",
        f"<h2>What was trained on: tokens shaded by <code>{html.escape(heading)}</code></h2>",
        "<ul>" + "".join(f"<li><b>{html.escape(label)}</b>: {html.escape(describe(meta))}</li>"
                         for label, _, meta in runs) + "</ul>",
        (f"<p>Every value is the tensor the loss used (per-token telemetry, no model). Wavy underline: a clip bound "
         f"was active; grey text: out of the loss; a dotted box: a token that is bytes of no whole character, shown "
         f"by its id. Colours: each side of the neutral value split into bins of about equal size, darker away from "
         f"it; the legend lists every bin drawn with its values' range and number of tokens. Hover a token for its "
         f"columns.{filter_text}</p>"),
        _summary_table({label: summary(frame) for label, frame, _ in runs}),
        notes,
    ]
    if all(len(frame) == 0 for _, frame, _ in runs):
        what = f"no token matches --filter {token_filter} ({FILTERS[token_filter]})" if token_filter else "no token"
        parts += [f'<p class="empty">Nothing to show: in the steps and groups picked, {html.escape(what)}.</p>',
                  "</body></html>"]  # fmt: skip
        return "\n".join(parts) + "\n"
    parts.append(legends)
    sides = [completions(frame, c) for (_, frame, _), c in zip(runs, columns, strict=True)]
    if len(runs) == 1:
        for entry in sides[0]:
            parts += _box(entry, columns[0], colours[0])
    else:
        right = {(e["prompt_index"], e["completion_index"]): e for e in sides[1]}
        parts.append('<div class="pair">' + "".join(f"<h3>{html.escape(label)}</h3>" for label, _, _ in runs)
                     + "</div>")
        for entry in sides[0]:
            other = right.pop((entry["prompt_index"], entry["completion_index"]), None)
            same = other is not None and other["prompt"] == entry["prompt"]
            parts.append('<div class="pair">')
            parts.append("<div>" + "\n".join(_box(entry, columns[0], colours[0])) + "</div>")
            parts.append("<div>" + ("\n".join(_box(other, columns[1], colours[1])) if other is not None else "") +
                         ("" if same or other is None else "<p><i>another prompt at this index</i></p>") + "</div>")
            parts.append("</div>")
        for other in right.values():
            parts += ['<div class="pair"><div></div><div>', *_box(other, columns[1], colours[1]), "</div></div>"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_telemetry_page(path: str | Path, *args, **kwargs) -> Path:
    return write_page(path, telemetry_page(*args, **kwargs))


def plot_telemetry(frame, path: str | Path, title: str) -> Path:
    """One figure of a telemetry step: (a) the weight against the token probability p (each loss token, coloured by
    the sign of its advantage), (b) the distribution of the token advantages A[i,t] against TRL's A[i], (c) where in
    the completion (relative position t / |o_i|) the tokens with an active clip bound fall."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = frame[frame["mask"] == 1]
    lengths = frame.groupby("row")["position"].transform("max") + 1
    relative = ((frame["position"] + 0.5) / lengths)[frame["mask"] == 1]  # token centres
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    positive = kept["advantage"] > 0
    ax.scatter(kept.loc[positive, "p"], kept.loc[positive, "weight"], s=6, alpha=0.5, color="tab:orange",
               label="A > 0")
    ax.scatter(kept.loc[~positive, "p"], kept.loc[~positive, "weight"], s=6, alpha=0.5, color="tab:blue",
               label="A <= 0")
    ax.set_xlabel("token probability p")
    ax.set_ylabel("token weight w")
    ax.set_title("weight against p")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1]
    bins = np.linspace(float(min(kept["advantage"].min(), kept["advantage_trl"].min())) - 1e-6,
                       float(max(kept["advantage"].max(), kept["advantage_trl"].max())) + 1e-6, 41) \
        if len(kept) else 10
    ax.hist(kept["advantage_trl"], bins=bins, alpha=0.5, color="gray", label="TRL's A[i] (per token)")
    ax.hist(kept["advantage"], bins=bins, alpha=0.6, color="tab:purple", label="A[i,t] trained")
    ax.set_xlabel("advantage")
    ax.set_ylabel("tokens")
    ax.set_title("token advantages")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[2]
    low = kept["clip_low"].astype(bool).to_numpy()
    high = kept["clip_high"].astype(bool).to_numpy()
    edges = np.linspace(0, 1, 11)
    ax.hist(relative.to_numpy(), bins=edges, color="lightgray", label=f"all loss tokens ({len(kept)})")
    ax.hist([relative.to_numpy()[low], relative.to_numpy()[high]], bins=edges, stacked=True,
            color=["tab:blue", "tab:red"], label=[f"low clip ({low.sum()})", f"high clip ({high.sum()})"])
    ax.set_xlabel("relative position in the completion t / |o|")
    ax.set_ylabel("tokens")
    ax.set_yscale("symlog")
    ax.set_title("where the clipped tokens fall")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    with plt.rc_context({"text.parse_math": False}):
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
