"""Search runs' settings reach where they act: the search demo config passes train.py's pre-model checks,
search_qa's backend choice, the eval's episode limits from the run, and episodes ending at any of TRL's EOS ids."""

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_search_demo_config_passes_train_checks_before_the_model(restore_environment):
    """What train.py's _main checks before building or loading a model, on configs/search_demo.yaml."""
    sys.path.insert(0, str(REPO))
    try:
        from sharpgrpo.cli import train
    finally:
        sys.path.remove(str(REPO))
    from trl import ModelConfig, TrlParser

    from sharpgrpo import SharpGRPOConfig
    from sharpgrpo.data.checks import load_checked_dataset
    from sharpgrpo.models.source import check_model_source
    from sharpgrpo.paths import shared_data_dir
    from sharpgrpo.run.input_checks import check_rewards, resolve_reward_functions
    from sharpgrpo.search.config import SearchArguments

    parser = TrlParser((train.TaskArguments, SharpGRPOConfig, ModelConfig, SearchArguments))
    task, args, model_args, search = parser.parse_args_and_config(
        args=["--config", str(REPO / "configs" / "search_demo.yaml")]
    )[:4]
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # the config's env block: the offline check applies
    check_model_source(model_args.model_name_or_path, revision=model_args.model_revision)
    assert search.enabled and "search_format" in task.reward_funcs
    funcs = resolve_reward_functions(task.reward_funcs)
    if shared_data_dir("qa") is None:
        pytest.skip("shared/data/qa is absent (set SHARPGRPO_SHARED_DIR)")
    dataset = load_checked_dataset(task.dataset_name, task.dataset_kwargs)
    check_rewards(task.reward_funcs, funcs, dataset, task.dataset_name, args.reward_weights)


def test_search_qa_uses_transformers_under_auto_and_refuses_vllm(tmp_path, monkeypatch):
    from sharpgrpo.evaluation import generation, runner
    from sharpgrpo.search.evaluation import search_backend

    assert search_backend("auto") == search_backend("transformers") == "transformers"
    with pytest.raises(ValueError, match="search_qa runs its multi-turn episodes with transformers"):
        search_backend("vllm")
    # build_generator on a machine with vLLM: search_qa still gets transformers, other tasks vLLM.
    monkeypatch.setattr(generation, "vllm_available", lambda: True)

    class Loading(Exception):
        """Raised where the transformers loader would start (the backend choice is what is tested)."""

    loaded = []

    def loader(*args, **kwargs):
        loaded.append(args)
        raise Loading

    monkeypatch.setattr("sharpgrpo.evaluation.models.load_model_and_tokenizer", loader)
    config = runner.EvalConfig(model="sharpgrpo-tiny-search", task="search_qa", output=str(tmp_path / "o.json"))
    with pytest.raises(ValueError, match="not vllm"):
        runner.build_generator(runner.dataclasses.replace(config, backend="vllm"), tmp_path)
    assert not loaded  # refused before loading anything
    assert generation.choose_backend("auto") == "vllm"
    with pytest.raises(Loading):
        runner.build_generator(config, tmp_path)  # auto: went on to the transformers loader
    assert loaded


def test_eval_reads_episode_limits_from_the_run(tmp_path):
    from sharpgrpo.search.evaluation import DEFAULT_EPISODE_LIMITS, run_episode_limits

    run = tmp_path / "run"
    checkpoint = run / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    assert run_episode_limits(str(checkpoint)) == (DEFAULT_EPISODE_LIMITS, None)
    (run / "training_args.json").write_text(json.dumps({"max_completion_length": 320, "max_turn_tokens": 64}))
    assert run_episode_limits(str(checkpoint))[0] == {"max_obs_tokens": 500, "max_turn_tokens": 64}
    (run / "search_args.json").write_text(json.dumps({"max_obs_tokens": 160, "max_turn_tokens": 64}))
    limits, source = run_episode_limits(str(checkpoint))
    assert limits == {"max_obs_tokens": 160, "max_turn_tokens": 64} and source.endswith("search_args.json")


def test_search_generator_passes_episode_limits(tmp_path, monkeypatch):
    import contextlib

    from sharpgrpo.evaluation import runner
    from sharpgrpo.search import evaluation

    monkeypatch.setattr("sharpgrpo.search.session.retrieval_session", lambda *a, **k: contextlib.nullcontext("c"))
    monkeypatch.setattr(evaluation.SearchEvalGenerator, "__init__",
                        lambda self, g, c, s: setattr(self, "search_args", s))
    config = runner.EvalConfig(model="m", task="search_qa", output=str(tmp_path / "o.json"))
    task = evaluation.SearchQATask()
    task.configure(config, {"retrieval_url": "http://127.0.0.1:1", "max_obs_tokens": 33, "max_turn_tokens": 44})
    task.prepare_config(config)  # both limits given: the run's own are not read
    with contextlib.ExitStack() as stack:
        generator = task.wrap_generator(config, None, str(tmp_path), stack)
    assert (generator.search_args.max_obs_tokens, generator.search_args.max_turn_tokens) == (33, 44)


def test_episode_ends_at_a_second_eos_id():
    from sharpgrpo.models.tiny import build_tokenizer
    from sharpgrpo.search.rollout import SearchLimits, run_episodes

    tokenizer = build_tokenizer()
    other_eos = tokenizer("x", add_special_tokens=False)["input_ids"][0]  # e.g. an instruct model's <|im_end|>
    text = tokenizer("<think>done</think>", add_special_tokens=False)["input_ids"]

    class Backend:
        def generate(self, rows, max_tokens, stop):
            return [(text + [other_eos] + text, None) for _ in rows]

    limits = SearchLimits(max_completion_length=200, max_search_turns=2, max_turn_tokens=100, invalid_action="end")
    prompt = [tokenizer("Q?", add_special_tokens=False)["input_ids"]]
    (episode,) = run_episodes(prompt, Backend(), lambda q: [[] for _ in q], tokenizer, limits)
    assert episode.end_reason == "turn_tokens"  # only the tokenizer's EOS: the id is ordinary text
    eos_ids = [tokenizer.eos_token_id, other_eos]
    (episode,) = run_episodes(prompt, Backend(), lambda q: [[] for _ in q], tokenizer, limits, eos_ids=eos_ids)
    assert episode.end_reason == "eos" and episode.completion_ids == text + [other_eos] and episode.turns == 1
