"""Settings plug in by registration (``sharpgrpo.settings``): the search setting's data set, evaluation task and
prepared model appear on the first lookup, no module of the package outside ``sharpgrpo/search`` imports it, and a
user's own multi-turn setting plugs into the evaluation runner the same way."""

import ast
import json
import sys
from pathlib import Path

from sharpgrpo import settings

PACKAGE = Path(settings.__file__).resolve().parent


def test_search_registers_itself_on_first_lookup():
    from sharpgrpo.data import DATASETS
    from sharpgrpo.evaluation import EVAL_TASKS
    from sharpgrpo.models.prepared import prepared_model_names

    assert "search_qa" in DATASETS and "search_qa" in EVAL_TASKS
    assert "sharpgrpo-tiny-search" in prepared_model_names()


def test_no_module_outside_the_search_package_imports_it():
    importers = []
    for path in PACKAGE.rglob("*.py"):
        if "search" in path.relative_to(PACKAGE).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "sharpgrpo.search" or n.startswith("sharpgrpo.search.") for n in names):
                importers.append(str(path.relative_to(PACKAGE)))
    assert importers == []
    assert settings.SETTING_MODULES[0] == "sharpgrpo.search.setting"  # the one registration


def test_a_users_multi_turn_setting_plugs_into_the_evaluator(tmp_path, monkeypatch):
    """A setting module written here registers a data set and an evaluation task whose generator wraps the
    evaluator's (as a multi-turn setting does); ``evaluate`` runs it without knowing it."""
    module = tmp_path / "echo_setting.py"
    module.write_text('''
from sharpgrpo.data import register_dataset
from sharpgrpo.evaluation.tasks import EVAL_TASKS, QATask, Problem

register_dataset("echo_rows")(lambda: [{"prompt": "say x"}])


class TwoTurns:
    """Wraps the evaluator's generator: two calls per prompt, the second on the first's text."""

    def __init__(self, inner):
        self.inner = inner

    def generate(self, prompts, settings, seed=0):
        first = self.inner.generate(prompts, settings, seed)
        second = self.inner.generate([p + s[0]["text"] for p, s in zip(prompts, first)], settings, seed)
        return [[{**b[0], "text": a[0]["text"] + b[0]["text"], "turns": {"n": 2}}] for a, b in zip(first, second)]


@EVAL_TASKS.register("echo")
class EchoTask(QATask):
    name = "echo"

    def load_problems(self, config):
        return [Problem(id="echo/0", group="echo", prompt="Q: x?", reference={"golden_answers": ["x"]})]

    def backend(self, requested):
        return "transformers"

    def wrap_generator(self, config, generator, workdir, stack):
        return TwoTurns(generator)
''')
    from sharpgrpo.data import DATASETS
    from sharpgrpo.evaluation import EVAL_TASKS, evaluate
    from sharpgrpo.models.tiny import build_tiny_model

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(settings, "SETTING_MODULES", list(settings.SETTING_MODULES))
    settings.add_setting("echo_setting")
    try:
        assert "echo_rows" in DATASETS and "echo" in EVAL_TASKS
        model = build_tiny_model(tmp_path / "tiny", warm_start_steps=0)
        result = evaluate(model=str(model), task="echo", output=str(tmp_path / "o.json"), max_new_tokens=4,
                          backend="auto", progress=False)
        record = json.loads((tmp_path / "o.samples.jsonl").read_text().splitlines()[1])
        assert record["turns"] == [{"n": 2}] and result["summary"]["datasets"]["echo"]["problems"] == 1
    finally:  # leave the registries as other tests expect them
        DATASETS._entries.pop("echo_rows", None)
        EVAL_TASKS._entries.pop("echo", None)
        settings._imported.discard("echo_setting")
        sys.modules.pop("echo_setting", None)


def test_training_hooks_come_from_the_settings(tmp_path):
    """train.py parses each registered setting's arguments and takes the rollout from the one that is on."""
    import contextlib
    from dataclasses import dataclass

    from sharpgrpo.search.config import SearchArguments
    from sharpgrpo.settings import _TRAINING, register_training_setting, training_rollout, training_setting_arguments

    assert SearchArguments in training_setting_arguments()
    with training_rollout([SearchArguments()], str(tmp_path)) as rollout:  # no retrieval server: search is off
        assert rollout is None

    @dataclass
    class ToyArguments:
        toy_turns: int = 0

    entered = []

    @contextlib.contextmanager
    def toy_rollout(args, output_dir):
        entered.append((args.toy_turns, output_dir))
        yield (lambda prompts, trainer: {"turns": args.toy_turns}) if args.toy_turns else None

    register_training_setting(ToyArguments, toy_rollout)
    try:
        assert training_setting_arguments()[-1] is ToyArguments
        with training_rollout([SearchArguments(), ToyArguments(toy_turns=2)], str(tmp_path)) as rollout:
            assert rollout(None, None) == {"turns": 2}
        assert entered == [(2, str(tmp_path))]
    finally:
        _TRAINING.pop()
