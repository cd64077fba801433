"""The rollout correction's per-token telemetry columns and ``sharpgrpo tokens --what-if`` on a real vLLM run.

One step of ``rollout_correction`` with real vLLM colocate generation (``sharpgrpo-tiny-vllm``, float32 engine) and
``token_telemetry``, with a setting whose decisions are exact whatever the size of the engine-trainer mismatch: token
weights truncated at C = 1 (``min(r, 1)``) and token K1 rejection with ratio bounds ``1e-30_1.0`` (rejects r < 1).
Then, from the file alone:

* the columns equal the strategy's own quantities: ``rejected`` where r < 1 (float32 comparison of the file's
  old_logp and sampling_logp), ``is_weight = min(r, 1)``, ``mismatch_k1/k3`` per token (float64 loop), the factor
  the loss used (``token_mask``) the weight, the rejected tokens out of the loss (``loss_mask`` 0, ``loss_share``
  0), and their means the logged ``rollout_corr/*`` metrics;
* ``--what-if rollout_rs_threshold=1.0_1e30`` (reject r > 1 instead) drops exactly the tokens with r > 1 only under
  the what-if and those with r < 1 only under the run's setting, on the page, in tokens.json and in the printed line;
* the page's legend, shaded by the correction's columns and by ``what_if/change``, lists exactly the colours drawn
  with their tokens' ranges and counts.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from helpers import binary_letters_reward, make_trainer, tiny_config
from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM


def _legend_matches_drawn(folder, frame, column):
    from diagnostics.test_telemetry_page import drawn_values, legend_of, page_boxes

    drawn = drawn_values(frame, page_boxes(folder), column)
    legend = legend_of(folder)
    assert sorted(css for css, _ in legend) == sorted(drawn)
    for css, label in legend:
        values = drawn[css]
        match = re.fullmatch(rf"{re.escape(column)} (\S+)(?: to (\S+))?(?: \((?:dropped|unchanged)\))?: (\d+)", label)
        assert match and int(match.group(3)) == len(values), label
        if css != "none":
            low, high = (float(f"{v:.4g}") for v in (min(values), max(values)))
            assert match.group(1) == f"{low:.3g}" and (match.group(2) or match.group(1)) == f"{high:.3g}"


def test_correction_columns_and_what_if_on_a_real_vllm_run(tiny_vllm_model, shared_engine, tmp_path):
    import contextlib
    import io

    from sharpgrpo.cli.tokens import main
    from sharpgrpo.diagnostics.correction_what_if import WhatIfError
    from sharpgrpo.diagnostics.telemetry import read_telemetry

    run = tmp_path / "run"
    args = tiny_config(run, use_vllm=True, vllm_mode="colocate", max_steps=1, token_telemetry=True,
                       strategies=["rollout_correction"], vllm_importance_sampling_correction=False,
                       rollout_is="token", rollout_is_threshold=1.0, rollout_rs="token_k1",
                       rollout_rs_threshold="1e-30_1.0")
    trainer = make_trainer(tiny_vllm_model, args, reward_funcs=[binary_letters_reward])
    trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "rollout_corr/kl" in entry)
    frame, meta = read_telemetry(run / "telemetry" / "telemetry_000001.parquet")
    assert meta["sampling_logps"] is True
    assert meta["strategy_params"]["rollout_correction"]["rollout_rs_threshold"] == "1e-30_1.0"
    name = "rollout_correction"
    assert "K1" in meta["columns"][f"{name}/mismatch_k1"]

    loss = frame["mask"].to_numpy() == 1
    old = frame["old_logp"].to_numpy(dtype=np.float32)[loss]
    sampling = frame["sampling_logp"].to_numpy(dtype=np.float32)[loss]
    assert np.isfinite(sampling).all()
    below, above = old < sampling, old > sampling  # r < 1, r > 1: exact in float32
    assert below.sum() > 0 and above.sum() > 0  # a real engine-trainer mismatch on both sides: the check has power
    column = {c: frame[f"{name}/{c}"].to_numpy(dtype=np.float64)[loss]
              for c in ("is_weight", "rejected", "mismatch_k1", "mismatch_k3", "token_mask", "loss_mask")}
    assert np.array_equal(column["rejected"], below.astype(np.float64))
    log_r = [float(o) - float(s) for o, s in zip(old, sampling, strict=True)]
    np.testing.assert_allclose(column["is_weight"], [min(math.exp(x), 1.0) for x in log_r], rtol=1e-6)
    np.testing.assert_allclose(column["mismatch_k1"], [-x for x in log_r], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(column["mismatch_k3"], [math.exp(x) - x - 1 for x in log_r], atol=1e-6)
    assert np.array_equal(column["token_mask"], column["is_weight"])  # the weight on the kept tokens' terms
    assert np.array_equal(column["loss_mask"], 1 - column["rejected"])  # rejected: out of the loss and its normaliser
    assert (frame["loss_share"].to_numpy()[loss][column["rejected"] == 1] == 0).all()
    assert logged["rollout_corr/kl"] == pytest.approx(column["mismatch_k1"].mean(), rel=1e-4, abs=1e-8)
    assert logged["rollout_corr/rejected_fraction"] == pytest.approx(column["rejected"].mean(), rel=1e-5)

    out = io.StringIO()  # (not capsys: vLLM's engine start needs a real sys.stdout)
    with contextlib.redirect_stdout(out):
        result = main(["--telemetry", str(run), "--what-if", "rollout_rs_threshold=1.0_1e30", "--max_groups", "99",
                       "--output", str(tmp_path / "what_if")])
    what = result["what_if"]
    assert (what["only_what_if"], what["only_run"], what["both"]) == (int(above.sum()), int(below.sum()), 0)
    assert what["loss_tokens"] == int(loss.sum()) and result["column"] == "what_if/change"
    printed = out.getvalue()
    assert f"{above.sum()} dropped only under the what-if, {below.sum()} only under the run's setting" in printed
    page = (tmp_path / "what_if" / "tokens.html").read_text()
    assert "<b>What if</b> rollout_rs_threshold=1.0_1e30" in page and "sampling_logp=" in page
    shown, _ = read_telemetry(run / "telemetry" / "telemetry_000001.parquet")
    from sharpgrpo.diagnostics.correction_what_if import parse_change, what_if

    shown, _ = what_if(shown, meta, [parse_change("rollout_rs_threshold=1.0_1e30")])
    change = shown["what_if/change"].to_numpy()[loss]
    assert np.array_equal(change, above.astype(float) - below.astype(float))
    _legend_matches_drawn(tmp_path / "what_if", shown, "what_if/change")

    for shade in (f"{name}/is_weight", f"{name}/mismatch_k1", f"{name}/rejected"):
        folder = tmp_path / shade.replace("/", "_")
        main(["--telemetry", str(run), "--shade", shade, "--max_groups", "99", "--output", str(folder)])
        _legend_matches_drawn(folder, frame, shade)

    with pytest.raises(WhatIfError, match="rollout_is_treshold is not a rollout-correction field"):
        main(["--telemetry", str(run), "--what-if", "rollout_is_treshold=1.5", "--output", str(tmp_path / "bad")])
