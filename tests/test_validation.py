"""Every bad value is refused before a model loads, with one line naming the field, the value and the allowed range.

Config fields are checked by constructing ``SharpGRPOConfig``; the script's inputs by running ``train.py``'s own
parser and ``main`` in-process, with the tiny model's cache pointed at an empty folder that must stay absent (so no
model was built or loaded). One subprocess run checks what a user sees: one line on stderr, no traceback.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CPU, cpu_config
from trl import ModelConfig, TrlParser

from sharpgrpo import SharpGRPOConfig
from sharpgrpo.run.errors import one_line_errors
from sharpgrpo.validation import ConfigError, between, integer, one_of, parse_strategy_names, positive

REPO = Path(__file__).resolve().parent.parent
DEMO_CONFIG = str(REPO / "configs" / "demo.yaml")
nan, inf = math.nan, math.inf


# (config fields, field named first in the message, expected fragment)
BAD_CONFIGS = [
    (dict(sg_tau=nan), "sg_tau", "sg_tau=nan: must be a finite number > 0"),
    (dict(sg_tau=0.0), "sg_tau", "sg_tau=0: must be a finite number > 0"),
    (dict(sg_tau=-1.0), "sg_tau", "sg_tau=-1: must be a finite number > 0"),
    (dict(sg_tau=True), "sg_tau", "sg_tau=True: must be a finite number > 0"),
    (dict(sg_alpha=inf), "sg_alpha", "sg_alpha=inf: must be a finite number > 0"),
    (dict(sg_alpha=0.0), "sg_alpha", "must be a finite number > 0"),
    (dict(sg_mu=nan), "sg_mu", "sg_mu=nan: must be a finite number"),
    (dict(sg_lower=0.0, sg_upper=1.4), "sg_lower", "sg_lower=0: must be a finite number > 0"),
    (dict(sg_upper=inf), "sg_upper", "sg_upper=inf: must be a finite number > 0"),
    (dict(sg_lower=1.5, sg_upper=1.4), "sg_lower", "must not exceed sg_upper=1.4"),
    (dict(random_weight_high=inf), "random_weight_high", "random_weight_high=inf: must be a finite number > 0"),
    (dict(random_weight_low=0.0), "random_weight_low", "random_weight_low=0: must be a finite number > 0"),
    (dict(random_weight_low=1.5, random_weight_high=0.5), "random_weight_low", "must not exceed random_weight_high"),
    (dict(random_weight_seed=-1), "random_weight_seed", "must be an integer >= 0 (or None)"),
    (dict(ar_alpha=1.5), "ar_alpha", "ar_alpha=1.5: must be a finite number in [0, 1]"),
    (dict(ar_alpha=nan), "ar_alpha", "ar_alpha=nan"),
    (dict(cw_sigma_eps=-1e-8), "cw_sigma_eps", "cw_sigma_eps=-1e-08: must be a finite number >= 0"),
    (dict(cw_scope="everything"), "cw_scope", "cw_scope='everything': must be one of group, batch"),
    (dict(thr_p=nan), "thr_p", "thr_p=nan: must be a finite number in [-1, 1]"),
    (dict(thr_p=1.5), "thr_p", "thr_p=1.5: must be a finite number in [-1, 1]"),
    (dict(thr_p=-1.01), "thr_p", "thr_p=-1.01"),
    (dict(thr_beta=-1.0), "thr_beta", "thr_beta=-1: must be a finite number >= 0"),
    (dict(thr_entropy_quantile=1.0), "thr_entropy_quantile", "must be a finite number in [0, 1)"),
    (dict(thr_chunk_size=0), "thr_chunk_size", "thr_chunk_size=0: must be an integer >= 1"),
    (dict(thr_vocab="partial"), "thr_vocab", "must be one of full, sampled"),
    (dict(dump_token_scores="no"), "dump_token_scores", "dump_token_scores='no': must be one of False, True"),
    (dict(thr_debug_dump=True), "thr_debug_dump", "thr_debug_dump=True: thr_debug_dump was renamed dump_token_scores"),
    (dict(passk_k=0), "passk_k", "passk_k=0: must be an integer >= 1"),
    (dict(passk_k=2.5), "passk_k", "passk_k=2.5: must be an integer >= 1"),
    (dict(strategies="passk_mixed", passk_k=9), "passk_k", "passk_k=9: must be an integer in [1, num_generations=8]"),
    (dict(sharpness_rho=nan), "sharpness_rho", "sharpness_rho=nan: must be a finite number > 0"),
    (dict(sharpness_rho=0.0), "sharpness_rho", "must be a finite number > 0"),
    (dict(sharpness_probe_steps=-1), "sharpness_probe_steps", "must be an integer >= 0"),
    (dict(weight_placement="inside"), "weight_placement", "weight_placement='inside': must be one of ratio, loss"),
    (dict(kl_weighting="outside"), "kl_weighting", "must be one of loss, inside, none"),
    (dict(learning_rate=-1e-3), "learning_rate", "learning_rate=-0.001: must be a finite number >= 0"),
    (dict(learning_rate=nan), "learning_rate", "learning_rate=nan"),
    (dict(temperature=0.0), "temperature", "temperature=0: must be a finite number > 0"),
    (dict(temperature=nan), "temperature", "temperature=nan"),
    (dict(max_completion_length=0), "max_completion_length", "max_completion_length=0: must be an integer >= 1"),
    (dict(max_steps=0), "max_steps", "max_steps=0: must be an integer >= 1 (or -1)"),
    (dict(max_steps=-2), "max_steps", "max_steps=-2"),
    (dict(beta=-0.1), "beta", "beta=-0.1: must be a finite number >= 0"),
    (dict(epsilon=-0.2), "epsilon", "epsilon=-0.2: must be a finite number in [0, 1e+30]"),
    (dict(epsilon=1e300), "epsilon", "epsilon=1e+300: must be a finite number in [0, 1e+30]"),
    (dict(epsilon_high=1e300), "epsilon_high", "3.4e38"),
    (dict(delta=1e300), "delta", "delta=1e+300"),
    (dict(save_steps=0), "save_steps", "save_steps=0: must be a finite number > 0"),
    (dict(epsilon_high=nan), "epsilon_high", "epsilon_high=nan: must be a finite number in [0, 1e+30] (or None)"),
    (dict(num_generations=1), "num_generations", "num_generations=1: must be an integer >= 2"),
    (dict(num_generations=0), "num_generations", "num_generations=0"),  # TRL would divide by it
    (dict(top_p=0.0), "top_p", "top_p=0: must be a finite number in (0, 1]"),
    (dict(num_iterations=0), "num_iterations", "num_iterations=0: must be an integer >= 1"),
    (dict(per_device_train_batch_size=0), "per_device_train_batch_size", "must be an integer >= 1"),
    (dict(reward_weights=[1.0, nan]), "reward_weights", "reward_weights[1]=nan: must be a finite number"),
    (dict(strategies=5), "strategies", "strategies=5: must be a strategy name, a list of names"),
    (dict(strategies=[5]), "strategies", "5 is not a strategy name"),
    (dict(strategies="grpo_sg grpo_sg"), "strategies", "grpo_sg listed twice"),
    (dict(strategies=[]), "strategies", "empty"),
    (dict(strategies="sharp_nonsense"), "strategies", "Unknown strategy 'sharp_nonsense'. Valid names:"),
]


@pytest.mark.parametrize(("kwargs", "field", "fragment"), BAD_CONFIGS, ids=lambda x: str(x)[:40])
def test_bad_config_value_is_one_line_naming_the_field(tmp_path, kwargs, field, fragment):
    with pytest.raises(ConfigError) as info:
        cpu_config(tmp_path, **kwargs)
    message = str(info.value)
    assert message.startswith(f"{field}=") or message.startswith(f"{field}["), message
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "value",
    ["grpo_sg,cw_grpo", "[grpo_sg, cw_grpo]", "grpo_sg, cw_grpo", ["grpo_sg", "cw_grpo"], ["[grpo_sg,", "cw_grpo]"],
     "grpo_sg cw_grpo", "['grpo_sg', 'cw_grpo']"],
)
def test_strategies_every_written_form(tmp_path, value):
    assert parse_strategy_names(value) == ["grpo_sg", "cw_grpo"]
    assert cpu_config(tmp_path, strategies=value).strategies == ["grpo_sg", "cw_grpo"]


def test_every_field_of_ours_has_a_rule():
    """A new SharpGRPOConfig field needs its line in FIELD_RULES (sharpgrpo/config.py)."""
    from dataclasses import fields

    from trl import GRPOConfig

    from sharpgrpo.config import FIELD_RULES

    ours = {f.name for f in fields(SharpGRPOConfig)} - {f.name for f in fields(GRPOConfig)} - {"strategies"}
    assert sorted(ours - set(FIELD_RULES)) == []


def test_rules_describe_their_range_and_accept_their_edges():
    assert between(-1, 1).accepts(-1) and between(-1, 1).accepts(1) and not between(-1, 1).accepts(1.0000001)
    assert not between(0, 1, high_open=True).accepts(1) and between(0, 1, high_open=True).accepts(0)
    assert not positive().accepts(0) and positive().accepts(1e-300) and not positive().accepts(inf)
    assert integer(1, extra=(-1,)).accepts(-1) and not integer(1).accepts(1.0) and not integer(1).accepts(True)
    assert one_of("a", "b").describe() == "one of a, b" and not one_of("a").accepts(None)
    assert between(0, 1, low_open=True).describe() == "a finite number in (0, 1]"
    assert integer(0, allow_none=True).accepts(None) and not integer(0).accepts(None)


def test_valid_edge_values_are_accepted(tmp_path):
    args = cpu_config(tmp_path, thr_p=-1.0, ar_alpha=0.0, beta=0.0, max_steps=-1, cw_sigma_eps=0.0, sg_lower=1.4)
    assert (args.thr_p, args.max_steps, args.sg_lower, args.sg_upper) == (-1.0, -1, 1.4, 1.4)


def test_values_trl_runs_with_are_accepted(tmp_path):
    """what TRL 1.16 accepts and runs with stays accepted unless the docs say why."""
    assert cpu_config(tmp_path, max_grad_norm=-1.0).max_grad_norm == -1.0  # <= 0 disables clipping in transformers
    assert cpu_config(tmp_path, max_grad_norm=0.0).max_grad_norm == 0.0
    assert cpu_config(tmp_path, num_train_epochs=0, max_steps=5).max_steps == 5  # epochs are ignored with max_steps > 0
    with pytest.raises(ConfigError, match="num_train_epochs=0 with max_steps=-1"):
        cpu_config(tmp_path, num_train_epochs=0, max_steps=-1)


def _docs_section(page, title):
    """The section ``## title`` of ``docs/page`` (to the next ``##`` heading or the page's end)."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def test_every_rule_stricter_than_trl_is_explained_in_the_docs(tmp_path):
    """TRL's GRPOConfig checks none of TRL_FIELD_RULES' fields: each one we check is named in docs/errors.md's list,
    and each listed value is really accepted by TRL's config and refused by ours."""
    from trl import GRPOConfig

    from sharpgrpo.validation import TRL_FIELD_RULES

    section = _docs_section("errors.md", "Stricter than TRL")
    assert sorted(f for f in TRL_FIELD_RULES if f"`{f}`" not in section) == []
    for field, value in [("max_steps", 0), ("top_k", -1), ("max_completion_length", None), ("temperature", 0.0),
                         ("learning_rate", -1e-6), ("seed", -1)]:
        GRPOConfig(output_dir=str(tmp_path), **CPU, **{field: value})
        with pytest.raises(ConfigError, match=f"^{field}="):
            cpu_config(tmp_path, **{field: value})


# ---------------------------------------------------------------------------------------------------------------
# train.py's front end, in-process


@pytest.fixture(scope="module")
def train_module():
    from sharpgrpo.cli import train

    yield train


@pytest.fixture
def data_files(tmp_path):
    files = {
        "empty.jsonl": "",
        "blank.jsonl": "\n  \n",
        "malformed.jsonl": '{"prompt": "a", "allowed": "abc"}\n{"prompt": \n',
        "array_row.jsonl": '[1, 2]\n',
        "prompt_only.jsonl": '{"prompt": "letters: a b c\\nword:"}\n',
        "malformed.json": '{"prompt": "a"}\n{"prompt" "b"}\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "strategies5.yaml").write_text(Path(DEMO_CONFIG).read_text() + "\nstrategies: 5\n")
    (tmp_path / "thr_nan.yaml").write_text(Path(DEMO_CONFIG).read_text() + "\nthr_p: .nan\n")
    return tmp_path


BAD_CLI = [
    (["--strategies", "5"], "strategies", "Unknown strategy '5'"),
    (["--strategies", "grpo_sg", "grpo_sg"], "strategies", "grpo_sg listed twice"),
    (["--config", "{tmp}/strategies5.yaml"], "strategies", "strategies=5: must be a strategy name"),
    (["--config", "{tmp}/thr_nan.yaml"], "thr_p", "thr_p=nan: must be a finite number in [-1, 1]"),
    (["--sg_tau", "nan"], "sg_tau", "sg_tau=nan: must be a finite number > 0"),
    (["--dataset_kwargs", "{bad"], "dataset_kwargs", "dataset_kwargs='{bad': not a valid JSON mapping"),
    (["--dataset_kwargs", "[1, 2]"], "dataset_kwargs", "must be a mapping"),
    (["--dataset_kwargs", "{num_prompts:0}"], "dataset_kwargs", "put a space after ':'"),
    (["--dataset_name", "kk"], "dataset_kwargs", "num_prompts not accepted by the loader of dataset_name='kk', "
     "which takes num_puzzles, min_people, max_people"),
    (["--dataset_kwargs", '{"num_prompts": 0}'], "dataset_kwargs.num_prompts", "num_prompts=0: must be an integer"),
    (["--dataset_kwargs", '{"num_prompts": "abc"}'], "dataset_kwargs.num_prompts", "'abc': must be an integer >= 1"),
    (["--dataset_kwargs", '{"num_prompts": 2.5}'], "dataset_kwargs.num_prompts", "2.5: must be an integer >= 1"),
    (["--dataset_kwargs", '{"num_prompts": -1}'], "dataset_kwargs.num_prompts", "-1: must be an integer >= 1"),
    (["--dataset_name", "kk", "--reward_funcs", "kk", "--dataset_kwargs", '{"min_people": 1}'],
     "dataset_kwargs.min_people", "min_people=1: must be an integer in [2, 8]"),
    (["--dataset_name", "math_eval", "--reward_funcs", "math", "--dataset_kwargs", '{"name": "gsm8k"}'],
     "dataset_kwargs.name", "name='gsm8k': must be one of math500, aime24"),
    (["--dataset_name", "{tmp}/empty.jsonl", "--dataset_kwargs", "{}"], "dataset_name", "empty.jsonl': the file is empty"),
    (["--dataset_name", "{tmp}/blank.jsonl", "--dataset_kwargs", "{}"], "dataset_name", "the file is empty"),
    (["--dataset_name", "{tmp}/malformed.jsonl", "--dataset_kwargs", "{}"], "dataset_name", "line 2 is not valid JSON"),
    (["--dataset_name", "{tmp}/malformed.json", "--dataset_kwargs", "{}"], "dataset_name", "line 2 is not valid JSON"),
    (["--dataset_name", "{tmp}/array_row.jsonl", "--dataset_kwargs", "{}"], "dataset_name", "line 1 is a JSON list"),
    (["--dataset_name", "{tmp}/prompt_only.jsonl", "--dataset_kwargs", "{}"], "reward_funcs",
     "'allowed_letters' reads column(s) allowed that dataset_name="),
    (["--dataset_name", "{tmp}/prompt_only.jsonl", "--dataset_kwargs", '{"max_samples": 0}'], "dataset_name",
     "0 prompts"),
    (["--dataset_name", "{tmp}/prompt_only.jsonl", "--dataset_kwargs", '{"bogus": 1}'], "dataset_kwargs",
     "bogus not accepted by the loader"),
    (["--dataset_name", "./no_such_data.jsonl"], "dataset_name", "no such file or directory"),
    (["--reward_funcs", "kk"], "reward_funcs", "'kk' reads column(s) solution_text_format"),
    (["--reward_funcs", "math"], "reward_funcs", "'math' reads column(s) answer"),
    (["--reward_funcs", "qa_em"], "reward_funcs", "'qa_em' reads column(s) golden_answers"),
    (["--reward_funcs", "no_such_reward"], "reward_funcs", "Unknown reward function 'no_such_reward'"),
    (["--reward_weights", "1", "2"], "reward_weights", "2 weight(s) for 1 reward function(s)"),
    (["--model_name_or_path", "./no_such_model"], "model_name_or_path", "no such directory"),
    (["--model_name_or_path", "{tmp}/missing/model"], "model_name_or_path", "no such directory"),
    (["--model_name_or_path", "{tmp}/not_a_model"], "model_name_or_path", "has no config.json"),
    (["--model_name_or_path", "not a hub id"], "model_name_or_path", "nor a valid Hugging Face Hub id"),
    (["--model_name_or_path", "no-such-org/no-such-model"], "model_name_or_path", "the Hub cache has no model"),
]


@pytest.mark.parametrize(("args", "field", "fragment"), BAD_CLI, ids=lambda x: str(x)[:50])
def test_bad_script_input_is_refused_before_any_model(train_module, data_files, monkeypatch, args, field, fragment):
    cache = data_files / "model_cache"
    monkeypatch.setenv("SHARPGRPO_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(data_files)
    args = [a.replace("{tmp}", str(data_files)) for a in args]
    argv = ([] if "--config" in args else ["--config", DEMO_CONFIG]) + args + ["--output_dir", str(data_files / "out")]
    parser = TrlParser((train_module.TaskArguments, SharpGRPOConfig, ModelConfig))
    with pytest.raises(ValueError) as info:
        train_module.main(*parser.parse_args_and_config(args=argv))
    message = str(info.value)
    assert isinstance(info.value, ConfigError), f"{type(info.value).__name__}: {message}"
    assert message.startswith(f"{field}=") or message.startswith(f"{field}["), message  # a list entry: field[i]=
    assert fragment in message and "\n" not in message
    assert not cache.exists() and not (data_files / "out").exists()  # no model built, loaded or saved


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--thr_p", "nan"], "thr_p=nan: must be a finite number in [-1, 1]."),  # refused while the config parses
        # refused after the config parsed, where transformers' gradient_checkpointing FutureWarning came first
        (["--dataset_kwargs", '{"num_prompts": "abc"}'], "dataset_kwargs.num_prompts='abc': must be an integer >= 1."),
    ],
    ids=["config_value", "dataset_kwargs"],
)
def test_script_prints_one_line_without_traceback(tmp_path, args, error):
    cache = tmp_path / "cache"
    env = {**os.environ, "SHARPGRPO_CACHE": str(cache), "OMP_NUM_THREADS": "1", "SHARPGRPO_DEBUG": "0"}
    command = [sys.executable, "train.py", "--config", DEMO_CONFIG, *args, "--output_dir", str(tmp_path / "out")]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"error: {error} (full traceback: --debug or SHARPGRPO_DEBUG=1)"], (
        result.stderr[-2000:]
    )
    assert not cache.exists() and not (tmp_path / "out").exists()


def test_debug_flag_or_variable_keeps_the_traceback(monkeypatch, capsys):
    monkeypatch.delenv("SHARPGRPO_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        with one_line_errors(["train.py"]):
            raise RuntimeError("first line\nsecond line")
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "error: RuntimeError: first line second line (full traceback: --debug or SHARPGRPO_DEBUG=1)\n"
    )
    argv = ["train.py", "--debug", "--max_steps", "3"]
    with pytest.raises(ConfigError, match="max_steps=0"):
        with one_line_errors(argv):
            assert argv == ["train.py", "--max_steps", "3"]  # the parser never sees --debug
            raise ConfigError("max_steps=0: must be an integer >= 1")
    monkeypatch.setenv("SHARPGRPO_DEBUG", "1")
    with pytest.raises(ConfigError):
        with one_line_errors(["train.py"]):
            raise ConfigError("sg_tau=nan: must be a finite number > 0")


@pytest.mark.parametrize("text", ['{"log_history": [{"step": 1, "loss": 0.5}', "[1, 2]", "\x00\xff"])
def test_plot_names_a_corrupt_trainer_state(tmp_path, text):
    from sharpgrpo.cli.plot import main as plot_main

    state = tmp_path / "run" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text(text)
    with pytest.raises(ValueError, match=r"run/trainer_state\.json: not (valid JSON|a trainer state)"):
        plot_main([str(state.parent), "--output", str(tmp_path / "plots")])
