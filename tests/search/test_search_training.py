"""Really training the tiny search model a few steps with multi-turn rollouts against a self-started retrieval server:
search/* is logged, retrieved tokens are masked (tool_mask), get exactly zero gradient, and the server is stopped."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="search training needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("uvicorn", reason="search training needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("bm25s", reason="search training needs the `search` extra (fastapi, uvicorn, bm25s)")

pytestmark = pytest.mark.slow  # multi-turn training runs against a retrieval server (CI: -m slow)
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CORPUS = ['"Paris"\nParis is the capital of France.', '"Berlin"\nBerlin is the capital of Germany.',
          '"Rome"\nRome is the capital of Italy.']
QUESTIONS = [("What is the capital of France?", ["Paris"]), ("What is the capital of Germany?", ["Berlin"])]


@pytest.fixture
def search_model(search_model_path):
    return search_model_path


def make_args(tmp_path, model_path, **overrides):
    from helpers import cpu_config
    from transformers import AutoTokenizer
    from trl import ModelConfig

    from sharpgrpo.cli import train
    from sharpgrpo.search.config import SearchArguments
    from sharpgrpo.search.format import make_prompt

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(CORPUS)))
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": make_prompt(q), "golden_answers": a}) + "\n" for q, a in QUESTIONS))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # Favour the search tags so that the untrained model searches in every episode.
    ids = tokenizer.convert_tokens_to_ids(["<search>", "</search>"])
    bias = {(ids[0],): 8.0, (ids[1],): 7.0}
    config = dict(
        save_strategy="no", max_steps=2, per_device_train_batch_size=4, num_generations=2, max_completion_length=64,
        temperature=1.0, learning_rate=1e-3, beta=0.0, loss_type="dapo", logging_steps=1, strategies=["grpo_sg"], seed=0,
        generation_kwargs={"sequence_bias": bias},
    )
    config.update(overrides)
    task = train.TaskArguments(dataset_name=str(data), reward_funcs=["qa_em"], plot=False)
    search = SearchArguments(retrieval_corpus=str(corpus), max_search_turns=2, retrieval_topk=2, max_obs_tokens=24,
                             max_turn_tokens=12, server_start_timeout=60)
    return task, cpu_config(tmp_path / "run", **config), ModelConfig(model_name_or_path=model_path), search


def test_search_training_logs_metrics_masks_and_stops_server(tmp_path, search_model):
    from sharpgrpo.cli import train

    task, args, model_args, search = make_args(tmp_path, search_model, strategies=["grpo_sg", "cw_grpo"])
    trainer = train.main(task, args, model_args, search)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 2
    for entry in logs:
        for name in ("search/turns_mean", "search/calls_mean", "search/frac_truncated", "search/latency_ms",
                     "search/frac_answer_retrieved"):
            assert name in entry, name
        assert 1 <= entry["search/turns_mean"] <= 3 and 0 <= entry["search/calls_mean"] <= 2
        assert (entry["search/latency_ms"] > 0) == (entry["search/calls_mean"] > 0)
    assert sum(entry["search/calls_mean"] for entry in logs) > 0
    assert not list((tmp_path / "run").glob("retrieval_server.*.port"))  # the server was stopped
    # the episode limits the eval reads back (sharpgrpo.search.evaluation.run_episode_limits)
    from sharpgrpo.search.evaluation import run_episode_limits

    limits, source = run_episode_limits(str(tmp_path / "run"))
    assert limits == {"max_obs_tokens": 24, "max_turn_tokens": 12} and source.endswith("search_args.json")


def loss_and_logps(trainer, output):
    """``trainer._compute_loss`` on ``output``, back-propagated, and the per-token log-probabilities of its forward
    with their gradient kept."""
    captured = {}
    forward = trainer._get_per_token_logps_and_entropies

    def capturing(*a, **k):
        logps, entropies, aux = forward(*a, **k)
        logps.retain_grad()
        captured["logps"] = logps
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capturing
    loss = trainer._compute_loss(trainer.model, output)
    loss.backward()
    return loss, captured["logps"]


def test_retrieved_tokens_get_zero_gradient(tmp_path, search_model):
    from sharpgrpo.cli import train
    from sharpgrpo.search.session import retrieval_session, search_rollout

    task, args, model_args, search = make_args(tmp_path, search_model, max_steps=1)
    with retrieval_session(search, args.output_dir) as client:
        trainer = train._main(task, args, model_args, rollout_func=search_rollout(search, client))
        inputs = [trainer.train_dataset[i // 2] for i in range(4)]
        trainer.model.train()
        output = trainer._generate_and_score_completions(inputs)
    tool_mask, completion_mask = output["tool_mask"], output["completion_mask"]
    assert ((tool_mask == 0) & (completion_mask == 1)).any()  # retrieved tokens inside the completions
    output["advantages"] = torch.randn(4)  # nonzero advantages on every row, so every sampled token has a gradient
    _, logps = loss_and_logps(trainer, output)
    grad = logps.grad
    assert torch.all(grad[tool_mask == 0] == 0)
    assert (grad[(tool_mask == 1) & (completion_mask == 1)] != 0).all()


def test_server_dying_mid_training_gives_clear_error(tmp_path, search_model):
    import time

    from sharpgrpo.cli import train
    from sharpgrpo.run.lifecycle import COMPLETE_MARKER, TrainingStopped
    from sharpgrpo.search.client import RetrievalClient, RetrievalError
    from sharpgrpo.search.server import RetrievalServerProcess
    from sharpgrpo.search.session import search_rollout

    task, args, model_args, search = make_args(tmp_path, search_model, max_steps=4)
    server = RetrievalServerProcess(search.retrieval_corpus, start_timeout=60)
    url = server.start()
    try:
        rollout = search_rollout(search, RetrievalClient(url, timeout=1.0, retries=2, backoff=0.05))
        calls = []

        def dying_rollout(prompts, trainer):
            if calls:  # the server dies after the first generation batch
                server.process.kill()
                server.process.wait()
            calls.append(1)
            return rollout(prompts, trainer)

        start = time.monotonic()
        # The run stops with the retrieval error named, after saving what training had (the crash-save rule).
        expected = f"RetrievalError: Retrieval server {url}/retrieve failed 2 time"
        with pytest.raises(TrainingStopped, match=expected) as info:
            train._main(task, args, model_args, rollout_func=dying_rollout)
        assert isinstance(info.value.__cause__, RetrievalError)
        assert time.monotonic() - start < 60 and len(calls) >= 2
        assert "is saved in" in str(info.value) and (Path(args.output_dir) / "checkpoint-1" / COMPLETE_MARKER).is_file()
    finally:
        server.stop()



def test_echo_trains_on_retrieved_passages(tmp_path, search_model):
    """ECHO (docs/methods.md §18.7) on the search setting's multi-turn episodes: the retrieved passages' tokens (role
    tool) get the gradient of echo_coef * their mean -log p, exactly -echo_coef / |env| on each log-probability, the
    other appended tokens none, while the model's
    own tokens keep the policy gradient; two training steps against the retrieval server log finite echo metrics with
    environment tokens in them."""
    from sharpgrpo.cli import train
    from sharpgrpo.search.session import retrieval_session, search_rollout

    (tmp_path / "grad").mkdir()
    (tmp_path / "train").mkdir()
    task, args, model_args, search = make_args(tmp_path / "grad", search_model, max_steps=1,
                                               strategies=["grpo_sg", "echo"], echo_coef=0.1)
    with retrieval_session(search, args.output_dir) as client:
        trainer = train._main(task, args, model_args, rollout_func=search_rollout(search, client))
        inputs = [trainer.train_dataset[i // 2] for i in range(4)]
        trainer.model.train()
        output = trainer._generate_and_score_completions(inputs)
    appended = (output["tool_mask"] == 0) & (output["completion_mask"] == 1)
    env = appended & (output["env_roles"] == 4)  # the passages (role tool, echo_roles' default); not the retry message
    assert env.any()  # (user) nor the closing end-of-sequence token (no message)
    _, logps = loss_and_logps(trainer, output)
    grad = logps.grad
    torch.testing.assert_close(grad[env], torch.full_like(grad[env], -0.1 / int(env.sum())), rtol=1e-6, atol=0)
    assert (grad[appended & ~env] == 0).all()

    task, args, model_args, search = make_args(tmp_path / "train", search_model, strategies=["grpo_sg", "echo"])
    trainer = train.main(task, args, model_args, search)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 2
    assert all(entry["echo/nll"] >= 0 and entry["echo/env_tokens"] >= 0 for entry in logs)
    assert sum(entry["echo/env_tokens"] for entry in logs) > 0 and any(entry["echo/nll"] > 0 for entry in logs)

def per_turn_search_reward(prompts, completions, search_turns, golden_answers, **kwargs):
    """A per-turn reward of a search episode: -0.1 for every turn that searched, then the exact match on the last
    turn (docs/methods.md §15.6); ``search_turns`` is the rollout's count of model turns, passed by TRL."""
    from reward_fns import get_reward_function

    outcome = get_reward_function("qa_em")(prompts, completions, golden_answers=golden_answers)
    return [{"per_turn": [-0.1] * (turns - 1) + [float(score)]} for turns, score in zip(search_turns, outcome)]


def test_per_turn_rewards_train_with_dense_returns_on_multi_turn_episodes(tmp_path, search_model):
    """The rollout's turns (runs of sampled tokens between retrieved passages) are the units the per-turn rewards are
    placed on: the reward's list length must match them, or the run stops naming the function."""
    from sharpgrpo.cli import train

    task, args, model_args, search = make_args(tmp_path, search_model, strategies=["dense_returns"])
    task.reward_funcs = ["test_search_training.per_turn_search_reward"]  # this file, on pytest's path
    trainer = train.main(task, args, model_args, search)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 2
    assert all(entry["dense_returns/units_mean"] >= 1 for entry in logs)
    assert any(entry["dense_returns/units_mean"] > 1 for entry in logs)  # multi-turn episodes were placed by turn
    assert any(entry["dense_returns/dense_fraction"] > 0 for entry in logs)


def one_question_signal_reward(prompts, completions, golden_answers, **kwargs):
    """0 for every episode of the France question (its groups carry no signal and are dropped), and 0 / 1 for the
    two episodes of a Germany group (always a signal): each step must refill, whatever the episodes say."""
    return [float(index % 2) if "Berlin" in gold else 0.0 for index, gold in enumerate(golden_answers)]


def test_dynamic_sampling_refills_with_multi_turn_search_episodes(tmp_path, search_model):
    """Dynamic sampling's refill rounds run the search rollout again on new prompts (TRL's rollout_func) and the step
    reports them (docs/methods.md §15.5)."""
    from sharpgrpo.cli import train

    task, args, model_args, search = make_args(tmp_path, search_model, dynamic_sampling=True,
                                               dynamic_sampling_max_rounds=4)
    task.reward_funcs = ["test_search_training.one_question_signal_reward"]  # this file, on pytest's path
    trainer = train.main(task, args, model_args, search)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 2
    print("dynamic sampling with search:", [{k: v for k, v in e.items() if k.startswith(("dynamic", "search/turns"))}
                                            for e in logs])
    for entry in logs:
        assert "search/turns_mean" in entry and 0 <= entry["dynamic_sampling/extra_rounds"] <= 4
        rounds = entry["dynamic_sampling/extra_rounds"] + 1
        assert entry["dynamic_sampling/groups_generated"] == 2 * rounds  # 2 groups of 2 per round
        assert entry["dynamic_sampling/groups_generated"] == (2 + entry["dynamic_sampling/groups_dropped"]
                                                             + entry["dynamic_sampling/groups_surplus"]
                                                             - entry["dynamic_sampling/groups_unfilled"])
    assert sum(e["dynamic_sampling/groups_dropped"] for e in logs) >= 2  # a France group in every step
    assert sum(e["dynamic_sampling/extra_rounds"] for e in logs) >= 2  # ... refilled by new search episodes
