"""Every shipped config parses through train.py's parser and is valid, without loading a model or any data.

Training configs (``configs/*.yaml``) are read by train.py's own parser (``sharpgrpo.cli.train.parse_arguments``:
its YAML reader refuses duplicate keys) with its dataclasses, exactly as ``python train.py --config FILE`` does,
which runs ``SharpGRPOConfig``'s own validation (strategies and their
parameters, batch divisibility). ``--use_cpu true`` is added so that the GPU configs' ``bf16: true`` passes
transformers' device check on a CPU machine; nothing else is overridden. Then: the reward functions and the dataset
resolve (the dataset's keyword arguments bind to the registered builder or to the file/Hub loader), the papers'
hyperparameters are those of GRPO-SG Table 6 / CW-GRPO Table 5 / the THR paper, and the accelerate configs load with
accelerate's own config reader. Every config then passes train.py's input checks (``check_training_inputs``) up to
the point where a model or a dataset would be downloaded, and the configs whose model is prepared here train a step. The tiny CPU variant of the CW-GRPO config is trained for its two steps.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((REPO / "configs" / "accelerate").glob("*.yaml"))
PAPER_CONFIGS = [
    path for path in CONFIGS if "cpu" not in path.stem and path.stem not in ("demo", "search_demo", "smol_addition_demo")
]

# GRPO-SG Table 6, shared by its three settings; temperature per setting.
TABLE_6 = dict(
    num_generations=8, learning_rate=1e-6, beta=0.001, epsilon=0.2, epsilon_high=0.24, max_completion_length=4096,
    strategies=["grpo_sg"], sg_alpha=2.0, sg_mu=0.25, sg_lower=1.0, sg_upper=1.4, sg_tau=pytest.approx(1 / 9),
    optim="adamw_torch",
)
EXPECTED = {
    "grpo_sg_kk_qwen2.5_3b": dict(TABLE_6, temperature=0.7, model="Qwen/Qwen2.5-3B-Instruct", rewards=["kk"]),
    "grpo_sg_kk_qwen2.5_7b": dict(TABLE_6, temperature=0.7, model="Qwen/Qwen2.5-7B-Instruct-1M", rewards=["kk"]),
    "grpo_sg_math_dsr_qwen2.5_7b": dict(TABLE_6, temperature=1.0, model="Qwen/Qwen2.5-7B", rewards=["math"]),
    "grpo_sg_math_orz_qwen2.5_7b": dict(TABLE_6, temperature=1.0, model="Qwen/Qwen2.5-7B", rewards=["math"]),
    "grpo_sg_search_qwen2.5_3b": dict(TABLE_6, temperature=0.8, model="Qwen/Qwen2.5-3B", rewards=["qa_em"]),
    "cw_grpo_math_r1_distill_qwen_1.5b": dict(
        strategies=["cw_grpo"], cw_scope="group", num_generations=12, temperature=0.7, learning_rate=1e-6,
        max_completion_length=4096, per_device_train_batch_size=12, gradient_accumulation_steps=4, max_steps=100,
        warmup_steps=0.1, model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", rewards=["math", "think_format"],
        dataset="knoveleng/open-rs",
    ),
    "cw_grpo_released_math_r1_distill_qwen_1.5b": dict(  # the authors' recipes/gaussian_1.5b.yaml
        strategies=["cw_grpo"], cw_variant="released", cw_weight_gradient=None, beta=0.04, kl_weighting="none",
        loss_type="grpo", num_iterations=1, steps_per_generation=1, num_generations=12, temperature=0.7,
        learning_rate=1e-6, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1},
        max_completion_length=4096, per_device_train_batch_size=12, gradient_accumulation_steps=4, max_steps=300,
        warmup_steps=0.1, seed=2025, vllm_importance_sampling_correction=False,
        model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", rewards=["math", "think_format"], dataset="knoveleng/open-rs",
    ),
    "thr_math_exploit_qwen2.5_math_1.5b": dict(
        strategies=["thr"], thr_p=0.1, num_generations=8, temperature=1.0, learning_rate=1e-6, beta=1e-4,
        epsilon=0.2, max_completion_length=3072, model="Qwen/Qwen2.5-Math-1.5B", rewards=["math"],
    ),
    "thr_math_explore_qwen2.5_math_1.5b": dict(
        strategies=["thr"], thr_p=-0.1, num_generations=8, temperature=1.0, learning_rate=1e-6, beta=1e-4,
        epsilon=0.2, max_completion_length=3072, model="Qwen/Qwen2.5-Math-1.5B", rewards=["math"],
    ),
}
# Completions per optimizer step and per generation batch on the GPUs the config is written for (its comments).
BATCHES = {  # name: (GPUs, completions per update, completions per generation)
    "grpo_sg_kk_qwen2.5_3b": (8, 256, 512),
    "grpo_sg_kk_qwen2.5_7b": (8, 256, 512),
    "grpo_sg_math_dsr_qwen2.5_7b": (8, 512, 1024),
    "grpo_sg_math_orz_qwen2.5_7b": (8, 512, 1024),
    "grpo_sg_search_qwen2.5_3b": (8, 256, 256),
    "cw_grpo_math_r1_distill_qwen_1.5b": (4, 192, 192),
    "cw_grpo_released_math_r1_distill_qwen_1.5b": (3, 144, 36),
    "thr_math_exploit_qwen2.5_math_1.5b": (4, 512, 2048),
    "thr_math_explore_qwen2.5_math_1.5b": (4, 512, 2048),
}


def parse(path: Path, *extra: str):
    """(TaskArguments, SharpGRPOConfig, ModelConfig) as train.py parses them: its own parser (duplicate keys refused,
    the settings' arguments such as the search setting's), ``sharpgrpo.cli.train.parse_arguments``."""
    from sharpgrpo.cli import train

    return train.parse_arguments(["--config", str(path), "--use_cpu", "true", *extra])[:3]


def test_every_config_is_covered():
    assert {path.stem for path in PAPER_CONFIGS} == set(EXPECTED) == set(BATCHES)
    assert any(path.stem == "cw_grpo_math_cpu" for path in CONFIGS)
    assert {path.stem for path in ACCELERATE_CONFIGS} == {"multi_gpu", "zero2", "zero3", "fsdp2"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_parses_and_validates(path, restore_environment):
    from reward_fns import get_reward_function
    from sharpgrpo.data import DATASETS
    from sharpgrpo.data.loading import load_dataset_source, resolve_prompt_template

    task, args, model_args = parse(path)
    for name in task.reward_funcs:
        assert callable(get_reward_function(name)), name
    kwargs = dict(task.dataset_kwargs or {})
    if task.dataset_name in DATASETS:
        inspect.signature(DATASETS.get(task.dataset_name)).bind(**kwargs)
    else:
        inspect.signature(load_dataset_source).bind(task.dataset_name, **kwargs)
        template = kwargs.get("prompt_template")
        assert template is None or "{" in resolve_prompt_template(template)  # names the column(s) it fills
    assert model_args.model_name_or_path
    assert args.per_device_train_batch_size * args.steps_per_generation % args.num_generations == 0
    assert not args.push_to_hub  # publishing is opt-in (`--push_to_hub true --hub_model_id ...`)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_passes_train_checks_before_the_model(path, restore_environment, monkeypatch, tmp_path):
    """train.py's input checks, as ``_main`` runs them before the tokenizer or model loads: the model source (a Hub id
    checked as an id: no Hub here), the reward functions, the dataset's name and arguments; a dataset that loads
    without a download (registered, or a file here) is loaded and checked with the rewards against its columns."""
    from sharpgrpo.data.checks import dataset_is_local
    from sharpgrpo.models.prepared import prepared_model_names
    from sharpgrpo.run.input_checks import check_training_inputs

    task, args, model_args = parse(path)
    if model_args.model_name_or_path not in prepared_model_names():
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the id's form is checked; nothing is fetched
    if task.dataset_name.startswith("data/"):  # a file the config's comments tell the user to download first
        from sharpgrpo.validation import ConfigError

        monkeypatch.chdir(tmp_path)
        with pytest.raises(ConfigError, match=r"^dataset_name='data/.*': no such file or directory"):
            check_training_inputs(task, args, model_args, load_dataset=False)
        _write_simplerl_zoo_rows(tmp_path / task.dataset_name)
    local = dataset_is_local(task.dataset_name)
    if path.stem in ("cw_grpo_math_cpu", "search_demo") and local:
        from sharpgrpo.paths import shared_data_dir

        local = shared_data_dir("math" if "math" in path.stem else "qa") is not None
    inputs = check_training_inputs(task, args, model_args, load_dataset=local)
    assert inputs.model_name == model_args.model_name_or_path
    assert len(inputs.reward_funcs) == len(task.reward_funcs)
    assert (inputs.train_dataset is not None) == local
    if local:
        assert len(inputs.train_dataset) > 0 and "prompt" in inputs.train_dataset.column_names


def _write_simplerl_zoo_rows(path: Path) -> None:
    """Rows in the layout the THR configs map (SimpleRL-Zoo's parquet: ``question``, ``extra_info.answer``): 64, the
    prompts of one of their generation batches (512 / 8), since fewer is refused as a run that cannot train."""
    import pandas as pd

    path.parent.mkdir(parents=True)
    rows = [{"question": f"What is {i} + {i + 1}?", "extra_info": {"answer": str(2 * i + 1)}} for i in range(64)]
    pd.DataFrame(rows).to_parquet(path)


def test_search_config_prompt_is_search_r1s_chat_message(restore_environment):
    """Search-R1 stores make_prefix(question) as one user message and renders it with the tokenizer's chat template
    when the tokenizer has one (github PeterGriffinJin/Search-R1 at a14dc3a: scripts/data_process/nq_search.py lines
    26-39 and 69-74; verl/utils/dataset/rl_dataset.py lines 126-131); Qwen2.5-3B's tokenizer has one. The config
    said `conversational` twice (true, then false), which train.py's parser refuses."""
    task, _, _ = parse(REPO / "configs" / "grpo_sg_search_qwen2.5_3b.yaml")
    assert task.dataset_kwargs["conversational"] is True
    assert task.dataset_kwargs["prompt_template"].startswith("Answer the given question. You must conduct reasoning")
    assert task.dataset_kwargs["prompt_template"].endswith("<answer> Beijing </answer>. Question: {question}\n")


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_configs_follow_the_papers(path, restore_environment):
    task, args, model_args = parse(path)
    expected = dict(EXPECTED[path.stem])
    assert model_args.model_name_or_path == expected.pop("model")
    assert task.reward_funcs == expected.pop("rewards")
    if "dataset" in expected:
        assert task.dataset_name == expected.pop("dataset")
    for field, value in expected.items():
        assert getattr(args, field) == value, field
    # GPU settings: bf16, gradient checkpointing, vLLM generation colocated with training, seeded by the trainer.
    assert args.bf16 and args.gradient_checkpointing and model_args.dtype == "bfloat16"
    assert args.use_vllm and args.vllm_mode == "colocate"
    assert "seed" not in (args.generation_kwargs or {})
    assert args.vllm_max_model_length >= args.max_completion_length
    gpus, per_update, per_generation = BATCHES[path.stem]
    assert args.per_device_train_batch_size * gpus * args.gradient_accumulation_steps == per_update
    assert args.per_device_train_batch_size * gpus * args.steps_per_generation == per_generation
    assert per_update % args.num_generations == 0 and per_generation % args.num_generations == 0


def test_kk_configs_use_logic_rl_puzzles(restore_environment):
    task, _, _ = parse(REPO / "configs" / "grpo_sg_kk_qwen2.5_3b.yaml")
    assert task.dataset_name == "kk"
    assert (task.dataset_kwargs["min_people"], task.dataset_kwargs["max_people"]) == (3, 7)


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.stem)
def test_accelerate_configs_load(path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    config = load_config_from_file(str(path))
    assert config.num_processes == 8 and config.num_machines == 1 and config.mixed_precision == "bf16"
    assert not config.use_cpu
    if path.stem == "multi_gpu":
        assert config.distributed_type == DistributedType.MULTI_GPU
    elif path.stem == "fsdp2":
        assert config.distributed_type == DistributedType.FSDP
        assert config.fsdp_config["fsdp_version"] == 2 and config.fsdp_config["fsdp_offload_params"] is False
    else:
        assert config.distributed_type == DistributedType.DEEPSPEED
        assert config.deepspeed_config["zero_stage"] == int(path.stem[-1])
        assert config.deepspeed_config["offload_optimizer_device"] == "none"
    if path.stem == "zero3":
        assert config.deepspeed_config["zero3_init_flag"] and config.deepspeed_config["zero3_save_16bit_model"]


@pytest.mark.slow
def test_cw_grpo_cpu_config_trains(tiny_model_path, tmp_path, restore_environment):
    """configs/cw_grpo_math_cpu.yaml through train.py for its two steps (the tiny model replaces the cached
    `sharpgrpo-tiny` build; the output goes to a temporary folder)."""
    from sharpgrpo.paths import shared_data_dir

    if shared_data_dir("math") is None:
        pytest.skip("the config reads the shared math data (shared/data/math), which is not available")
    sys.path.insert(0, str(REPO))
    try:
        from sharpgrpo.cli import train
    finally:
        sys.path.remove(str(REPO))
    task, args, model_args = parse(
        REPO / "configs" / "cw_grpo_math_cpu.yaml", "--model_name_or_path", tiny_model_path,
        "--output_dir", str(tmp_path),
    )
    trainer = train.main(task, args, model_args)
    log = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(log) == 2
    assert all("cw/weight_mean" in entry and "rewards/math_reward/mean" in entry for entry in log)
    assert (tmp_path / "model.safetensors").is_file() and "cw_grpo" in (tmp_path / "README.md").read_text()


def _offline_configs():
    """The configs whose model is built here without any download (the tiny models), and the real-model demo
    (sharpgrpo-smol, fetched from PyPI on first use: with the real-model tests)."""
    paths = [REPO / "configs" / f"{name}.yaml" for name in ("demo", "strict_letters_cpu", "search_demo")]
    smol = REPO / "configs" / "smol_addition_demo.yaml"
    return [*paths, pytest.param(smol, marks=pytest.mark.real_model, id="smol_addition_demo")]


@pytest.mark.slow
@pytest.mark.parametrize("path", _offline_configs(), ids=lambda p: p.stem)
def test_offline_config_trains_a_step(path, tmp_path, restore_environment):
    """The config through ``sharpgrpo train``'s whole command (parser, checks, model, training, saving) for one step;
    only the output folder, the step count and the plot are overridden."""
    from sharpgrpo.cli import train
    from sharpgrpo.paths import shared_data_dir

    if path.stem == "search_demo" and shared_data_dir("qa") is None:
        pytest.skip("search_demo serves the shared QA corpus (shared/data/qa), which is not available")
    train.cli(["--config", str(path), "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--plot", "false",
               "--save_strategy", "no"])  # fmt: skip
    import json

    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and any("loss" in entry for entry in state["log_history"])
    assert (tmp_path / "run" / "model.safetensors").is_file()
