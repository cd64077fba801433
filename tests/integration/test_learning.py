"""Every registered strategy, with its defaults, learns on the demo task: for each of 3 seeds the mean
reward of the last 10% of the demo's 200 steps is above that of the first 10%.

27 demo runs (about 25 s each on an idle CPU core, several times that on a loaded one): marked slow AND opt-in,
``SHARPGRPO_LEARNING_TEST=1 python -m pytest tests/integration/test_learning.py``. The same runs as a benchmark:
``python benchmarks/learning_bench.py`` (results in benchmarks/RESULTS.md, "Learning on the demo task").
"""

import importlib.util
import os
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SHARPGRPO_LEARNING_TEST") != "1",
                       reason="27 demo training runs (tens of minutes on CPU): set SHARPGRPO_LEARNING_TEST=1"),
]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "learning_bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("learning_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_strategy_learns_on_the_demo_for_three_seeds(tmp_path):
    bench = load_bench()
    from sharpgrpo.strategies import STRATEGIES

    builtin = sorted(n for n in STRATEGIES.names() if STRATEGIES.get(n).__module__.startswith("sharpgrpo."))
    assert sorted(bench.DEFAULT_STRATEGIES) == builtin  # the benchmark covers every registered strategy
    results = bench.run_all(bench.DEFAULT_STRATEGIES, seeds=(0, 1, 2), workdir=tmp_path)
    print(bench.markdown(results))
    failures = [r for r in results if not r["last"] > r["first"]]
    assert not failures, failures
