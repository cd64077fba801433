"""docs/development.md's "Adding a strategy" as an exercise: a new method is four files and nothing else.

A copy of the package and its docs is made in a temporary folder and a loss strategy, ``exercise_mask``, is added to
it as the recipe says: (1) its module in ``sharpgrpo/strategies/`` (a pure function and a thin registered class), (2)
its parameter in ``sharpgrpo/strategy_params.py``, (3) its test in ``tests/strategies/``, (4) its section in
``docs/methods.md`` and its row in ``docs/strategies.md``'s strategy table. No other file is edited: no import list, no trainer,
no config. Then, in a fresh interpreter on the copy, the strategy is selectable by name, its parameter is checked
(a bad value refused naming the field), its metric and per-token term are logged, the telemetry file has its
``exercise_mask/token_mask`` column with a description, its own test passes, and the docs check finds it documented;
the same copy without the docs section is refused by that check, naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_strategy_docs import undocumented

ROOT = Path(__file__).resolve().parents[2]
NAME = "exercise_mask"

MODULE = '''
"""Exercise mask: the policy term of a token whose log-ratio leaves [-threshold, threshold] is removed.

    m[i,t] = 1[|log p[i,t] - log p_old[i,t]| <= threshold]    (docs/methods.md, "Exercise mask")
"""

import torch

from sharpgrpo.strategies import LossTerms, StrategyPaper, TokenLossStrategy, register_strategy


def exercise_mask(logps: torch.Tensor, old_logps: torch.Tensor, threshold: float) -> torch.Tensor:
    """(B, T) log-probabilities now and at sampling -> (B, T) {0, 1} mask of the tokens inside the region."""
    return ((logps.detach() - old_logps).abs() <= threshold).to(logps.dtype)


@register_strategy("exercise_mask")
class ExerciseMask(TokenLossStrategy):
    """``exercise_mask`` of the micro-batch, as a token mask."""

    params = ("exercise_threshold",)
    metrics = ("exercise_mask/frac_masked",)
    paper = StrategyPaper("An exercise", "The README's recipe, 2026.")

    def loss_terms(self, context):
        mask = exercise_mask(context.logps, context.old_logps, self.args.exercise_threshold)
        masked = ((1 - mask) * context.mask).sum() / context.mask.sum().clamp(min=1)
        return LossTerms(token_mask=mask), {"exercise_mask/frac_masked": masked}
'''

PARAM = '''
    exercise_threshold: float = param(
        0.5, "`exercise_mask`: |log p - log p_old| above which a token's policy term is removed.", positive()
    )

'''

TEST = '''
import math

import torch

from sharpgrpo.strategies.exercise_mask import exercise_mask


def test_against_a_float64_loop():
    generator = torch.Generator().manual_seed(0)
    logps, old = -torch.rand(3, 5, generator=generator, dtype=torch.float64) * 3, None
    old = logps + torch.randn(3, 5, generator=generator, dtype=torch.float64)
    mask = exercise_mask(logps, old, 0.5)
    for i in range(3):
        for t in range(5):
            assert mask[i, t].item() == float(math.fabs(logps[i, t].item() - old[i, t].item()) <= 0.5)
    assert 0 < mask.sum() < mask.numel()
'''

DOCS = '''

## 99. Exercise mask (`exercise_mask`)

m[i,t] = 1[|log p[i,t] - log p_old[i,t]| <= `exercise_threshold`] multiplies the token's policy term.
'''

ROW_AFTER = "| `archer` |"
ROW = ("| `exercise_mask` | loss | the policy term of tokens with \\|log r\\| > threshold is removed | an exercise | "
       "`exercise_threshold` 0.5 | float64 loop |\n")

RUN = '''
import json, sys, warnings
from pathlib import Path

import pyarrow.parquet as pq
from transformers import AutoTokenizer

root, model, output = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
import sharpgrpo
assert Path(sharpgrpo.__file__).resolve().is_relative_to(root.resolve()), sharpgrpo.__file__
from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset
from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.validation import ConfigError

base = dict(report_to=[], use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
            max_completion_length=8, learning_rate=1e-3, logging_steps=1, save_strategy="no", seed=0, max_steps=2,
            num_iterations=2, token_telemetry=True)
result = {"registered": "exercise_mask" in STRATEGIES.names()}
try:
    SharpGRPOConfig(output_dir=str(output / "bad"), strategies=["exercise_mask"], exercise_threshold=-1.0, **base)
except ConfigError as error:
    result["refused"] = str(error)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    args = SharpGRPOConfig(output_dir=str(output / "run"), strategies=["exercise_mask"], exercise_threshold=0.05,
                           **base)
    trainer = SharpGRPOTrainer(model=model, reward_funcs=[allowed_letters_reward], args=args,
                               train_dataset=demo_dataset(16), processing_class=AutoTokenizer.from_pretrained(model))
    trainer.train()
result["logged"] = sorted({k for entry in trainer.state.log_history for k in entry if k.startswith("exercise_mask/")})
files = sorted((output / "run" / "telemetry").glob("*.parquet"))
table = pq.read_table(files[-1])
meta = json.loads(table.schema.metadata[b"sharpgrpo.telemetry"])
result["columns"] = {name: meta["columns"][name] for name in table.column_names if name.startswith("exercise_mask/")}
result["masked"] = float(sum(1 - v for v in table.column("exercise_mask/token_mask").to_pylist()))
print("RESULT " + json.dumps(result))
'''


def write_copy(folder: Path, with_docs: bool = True) -> Path:
    """The project's package and docs copied to ``folder``, plus the four files (the docs only ``with_docs``)."""
    shutil.copytree(ROOT / "sharpgrpo", folder / "sharpgrpo", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "methods.md", folder / "docs" / "methods.md")
    shutil.copy(ROOT / "docs" / "strategies.md", folder / "docs" / "strategies.md")
    # 1. its module
    (folder / "sharpgrpo" / "strategies" / f"{NAME}.py").write_text(textwrap.dedent(MODULE).lstrip())
    # 2. its parameter, in the one home of strategy parameters
    params = folder / "sharpgrpo" / "strategy_params.py"
    source = params.read_text(encoding="utf-8")
    anchor = "    def __post_init__(self):\n        validate_fields(self, PARAM_RULES)"
    assert source.count(anchor) == 1
    params.write_text(source.replace(anchor, PARAM.lstrip("\n") + anchor), encoding="utf-8")
    # 3. its test
    (folder / "tests" / "strategies").mkdir(parents=True)
    (folder / "tests" / "strategies" / f"test_{NAME}.py").write_text(textwrap.dedent(TEST).lstrip())
    # 4. its docs: a section of docs/methods.md and a row of docs/strategies.md's strategy table
    if with_docs:
        with open(folder / "docs" / "methods.md", "a", encoding="utf-8") as methods:
            methods.write(DOCS)
        page = (folder / "docs" / "strategies.md").read_text(encoding="utf-8")
        line = next(line for line in page.splitlines(keepends=True) if line.startswith(ROW_AFTER))
        (folder / "docs" / "strategies.md").write_text(page.replace(line, line + ROW, 1), encoding="utf-8")
    return folder


def run_in(folder: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(folder), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, *command], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_a_new_method_is_four_files(tiny_model_path, tmp_path):
    copy = write_copy(tmp_path / "copy")
    (copy / "run_exercise.py").write_text(textwrap.dedent(RUN).lstrip())
    done = run_in(copy, "run_exercise.py", str(copy), tiny_model_path, str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["registered"]  # selectable by name: no import list was edited
    assert result["refused"].startswith("exercise_threshold=-1: must be")  # its parameter is checked
    assert result["logged"] == ["exercise_mask/frac_masked"]
    assert "exercise_mask (loss strategy)" in result["columns"]["exercise_mask/token_mask"]  # named and described
    assert result["masked"] > 0  # the second step is off-policy: some tokens left the region
    own_test = run_in(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/strategies/test_{NAME}.py")
    assert own_test.returncode == 0, own_test.stdout[-2000:]
    assert undocumented(copy, [NAME]) == []


def test_without_its_docs_section_it_is_refused(tmp_path):
    copy = write_copy(tmp_path / "copy", with_docs=False)
    assert undocumented(copy, [NAME]) == [
        f"{NAME}: no row in docs/strategies.md's strategy table",
        f"{NAME}: no docs/methods.md section heading naming it",
    ]
    assert undocumented(write_copy(tmp_path / "documented"), [NAME]) == []
