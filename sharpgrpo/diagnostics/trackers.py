"""A telemetry step's token-viewer page and completions, sent to the experiment trackers of ``report_to``.

The step's summary numbers (``telemetry/*``: weight, advantage, ratio quantiles, the clipped and rejected fractions)
reach every tracker as metrics through TRL's own logging (`sharpgrpo.training.telemetry.recorder.step_summary`).
What a tracker shows besides numbers is sent here, by :class:`TelemetryTrackerCallback` at the end of each telemetry
step, after the step's file is written (``sharpgrpo train`` installs it when ``token_telemetry`` is on and
``report_to`` names a tracker; from Python: ``trainer.add_callback(TelemetryTrackerCallback(trainer))``):

* the token-viewer page of the step (the page ``sharpgrpo tokens --telemetry RUN --step N`` writes, also saved as
  ``output_dir/telemetry/tokens_<step>.html``);
* the step's completions, one row per completion: its prompt, text, reward, TRL's advantage, the mean token advantage
  and weight it was trained with, and its clipped tokens.

trackio: ``telemetry/tokens`` (``trackio.Html``) and ``telemetry/completions`` (``trackio.Table``), logged into the run
transformers' ``TrackioCallback`` opened. TensorBoard (which renders no HTML): the completions as a markdown table in
the text tab (``telemetry/completions``) and the page's path (``telemetry/tokens``), written with the event writer of
transformers' ``TensorBoardCallback``. Other trackers get the metrics only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from sharpgrpo.diagnostics.telemetry import read_telemetry, select_tokens, telemetry_page
from sharpgrpo.diagnostics.token_page import write_page
from sharpgrpo.training.telemetry.recorder import FOLDER

ARTIFACT_TRACKERS = ("trackio", "tensorboard")  # the trackers that get the page and the table
PAGE_GROUPS = 8  # groups shown on a tracker's page (the whole step is in the parquet file)


def completions_table(frame):
    """One row per completion of a telemetry frame (global order): step, group, index, prompt, text, reward, TRL's
    advantage, the mean token advantage and weight over its loss tokens, and its number of clipped tokens."""
    import pandas as pd

    rows = []
    for row, tokens in frame.groupby("row", sort=True):
        first, kept = tokens.iloc[0], tokens[tokens["mask"] == 1]
        rows.append({
            "step": int(first["step"]), "group": int(first["prompt_index"]),
            "completion_index": int(first["completion_index"]), "prompt": str(first.get("prompt", "")),
            "completion": "".join(tokens.sort_values("position")["token"].astype(str)),
            "reward": float(first.get("reward", math.nan)), "advantage_trl": float(first["advantage_trl"]),
            "advantage": float(kept["advantage"].mean()) if len(kept) else math.nan,
            "weight": float(kept["weight"].mean()) if len(kept) else math.nan,
            "clipped_tokens": int((kept["clip_low"].astype(bool) | kept["clip_high"].astype(bool)).sum()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def markdown_table(table) -> str:
    """``table`` (a DataFrame) as a markdown table (TensorBoard's text tab renders markdown)."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


class TelemetryTrackerCallback(TrainerCallback):
    """Sends each telemetry step's page and completions to the run's trackers (module docstring). Install it after
    the trainer is built: it runs after the telemetry callback, which writes the step's file."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return control
        path = Path(args.output_dir) / FOLDER / f"telemetry_{state.global_step:06d}.parquet"
        trackers = [name for name in ARTIFACT_TRACKERS if name in (args.report_to or [])]
        if not trackers or not path.is_file():  # not a telemetry step
            return control
        frame, meta = read_telemetry(path)
        column = "weight" if any(c.startswith("weight/") for c in frame.columns) else "advantage"
        label = f"{Path(args.output_dir).name} step {state.global_step}"
        page = telemetry_page([(label, select_tokens(frame, max_groups=PAGE_GROUPS), meta)], column, None)
        page_path = write_page(path.with_name(f"tokens_{state.global_step:06d}.html"), page)
        table = completions_table(frame)
        if "trackio" in trackers:
            self._trackio(state.global_step, page_path, table)
        if "tensorboard" in trackers:
            self._tensorboard(state.global_step, page_path, table)
        return control

    def _trackio(self, step: int, page_path: Path, table) -> None:
        import trackio

        if trackio.context_vars.current_run.get() is None:  # transformers' TrackioCallback opens the run
            return
        trackio.log({"telemetry/tokens": trackio.Html(str(page_path)), "telemetry/completions":
                     trackio.Table(dataframe=table), "train/global_step": step})  # fmt: skip

    def _tensorboard(self, step: int, page_path: Path, table) -> None:
        from transformers.integrations import TensorBoardCallback

        writers = [cb.tb_writer for cb in self.trainer.callback_handler.callbacks
                   if isinstance(cb, TensorBoardCallback) and cb.tb_writer is not None]  # fmt: skip
        for writer in writers:
            writer.add_text("telemetry/completions", markdown_table(table), step)
            writer.add_text("telemetry/tokens", f"Token-viewer page of step {step}: `{page_path}`", step)
            writer.flush()
