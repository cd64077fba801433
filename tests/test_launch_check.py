"""The launch check (sharpgrpo/training/launch_check.py): what the launcher asked for against what accelerate built.

The environment variables are those ``accelerate launch`` exports to its workers (accelerate 1.x,
``accelerate/utils/launch.py``: ``ACCELERATE_USE_FSDP``, ``FSDP_VERSION``, ``ACCELERATE_USE_DEEPSPEED``,
``ACCELERATE_DEEPSPEED_ZERO_STAGE``; torchrun's ``WORLD_SIZE``). The real launches that these refusals stop are in
tests/integration/test_launch_refusals.py.
"""

from __future__ import annotations

import pytest
from helpers import cpu_config, make_trainer

from sharpgrpo.training.launch_check import (
    check_launch_request,
    launch_mismatch,
    launcher_config_file,
    requested_launch,
)
from sharpgrpo.validation import ConfigError

FSDP2 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "WORLD_SIZE": "2"}
ZERO3 = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "WORLD_SIZE": "2"}


def test_request_read_from_the_launcher_environment():
    assert requested_launch(FSDP2) == requested_launch({**FSDP2}, fsdp=None)
    assert requested_launch(FSDP2).backend == "fsdp" and "fsdp_version 2" in requested_launch(FSDP2).detail
    assert requested_launch(ZERO3).detail == "DeepSpeed ZeRO-3"
    assert requested_launch({"WORLD_SIZE": "4"}) .backend is None
    assert requested_launch({"WORLD_SIZE": "4"}).world_size == 4
    assert requested_launch({}).world_size == 1
    assert requested_launch({}, fsdp=["full_shard"]).backend == "fsdp"  # TrainingArguments.fsdp
    assert requested_launch({}, deepspeed="ds.json").backend == "deepspeed"
    assert requested_launch({"ACCELERATE_USE_FSDP": "false"}).backend is None


def test_what_was_asked_is_accepted():
    assert launch_mismatch(requested_launch(FSDP2), "FSDP", 2) is None
    assert launch_mismatch(requested_launch(ZERO3), "DEEPSPEED", 2) is None
    assert launch_mismatch(requested_launch({"WORLD_SIZE": "2"}), "MULTI_CPU", 2) is None
    assert launch_mismatch(requested_launch({}), "NO", 1) is None


@pytest.mark.parametrize(
    ("env", "built", "processes", "expected"),
    [
        (FSDP2, "MULTI_CPU", 2,
         ["configs/accelerate/fsdp2.yaml", "FSDP (fsdp_version 2)", "MULTI_CPU with 2 processes"]),
        (FSDP2, "MULTI_GPU", 2, ["FSDP", "MULTI_GPU with 2 processes"]),
        (ZERO3, "MULTI_CPU", 2, ["DeepSpeed ZeRO-3", "MULTI_CPU with 2 processes"]),
        ({"WORLD_SIZE": "2"}, "NO", 1, ["launched 2 processes but each sees 1", "NO with 1 process", "use_cpu"]),
    ],
)
def test_something_else_built_is_one_line_naming_config_and_build(env, built, processes, expected):
    name = "the accelerate config configs/accelerate/fsdp2.yaml"
    message = launch_mismatch(requested_launch(env), built, processes, name)
    assert message is not None and "\n" not in message
    for part in expected:
        assert part in message


def test_config_file_read_from_the_launcher_command_line():
    launcher = ["python", "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/zero3.yaml",
                "--num_processes", "2", "train.py", "--config", "configs/demo.yaml"]
    assert launcher_config_file(launcher) == "configs/accelerate/zero3.yaml"
    assert launcher_config_file(["accelerate", "launch", "--config_file=x.yaml", "t.py"]) == "x.yaml"
    assert launcher_config_file(["torchrun", "--nproc_per_node", "2", "t.py"]) is None


def test_fsdp_on_the_cpu_refused_before_accelerate_starts(tmp_path):
    args = cpu_config(tmp_path)
    launcher = ["accelerate", "launch", "--config_file", "configs/accelerate/fsdp2.yaml", "train.py"]
    expected = (r"^launch: the accelerate config configs/accelerate/fsdp2.yaml asks for FSDP \(fsdp_version 2\) but "
                r"use_cpu is true")
    with pytest.raises(ConfigError, match=expected):
        check_launch_request(args, FSDP2, launcher)
    args.use_cpu = False
    with pytest.raises(ConfigError, match="this machine has no GPU"):
        check_launch_request(args, FSDP2, launcher, accelerator_available=False)
    check_launch_request(args, FSDP2, launcher, accelerator_available=True)  # on GPUs: accelerate builds FSDP
    check_launch_request(cpu_config(tmp_path), ZERO3, launcher)  # DeepSpeed runs on the CPU (gloo)


def test_trainer_refuses_fsdp_on_the_cpu_before_loading(tiny_model_path, tmp_path, monkeypatch):
    """The real trainer, with the environment ``accelerate launch --config_file fsdp2.yaml`` gives a worker."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(ConfigError, match="asks for FSDP .* but use_cpu is true"):
        make_trainer(tiny_model_path, cpu_config(tmp_path, per_device_train_batch_size=8, num_generations=4))


def test_sharded_parameters_rule_out_the_sharpness_probe():
    from sharpgrpo.training.launch_check import sharded_parameters

    assert sharded_parameters("FSDP") == "FSDP"
    assert sharded_parameters("DEEPSPEED", 3) == "DeepSpeed ZeRO-3"
    assert sharded_parameters("DEEPSPEED", 2) is None  # ZeRO-2 keeps whole parameters on every process
    assert sharded_parameters("MULTI_CPU") is None


def test_fsdp1_refused_with_strategies_that_read_the_head(tmp_path):
    fsdp1 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "WORLD_SIZE": "2"}
    args = cpu_config(tmp_path)
    args.use_cpu = False
    with pytest.raises(ConfigError, match=r"^strategies=\['thr'\]: .* asks for FSDP1 \(fsdp_version 1\)"):
        check_launch_request(args, fsdp1, [], accelerator_available=True, head_readers=["thr"])
    check_launch_request(args, fsdp1, [], accelerator_available=True, head_readers=[])  # grpo_sg etc.: FSDP1 is fine
    check_launch_request(args, FSDP2, [], accelerator_available=True, head_readers=["thr"])  # FSDP2 gathers the head
