"""Train a policy with SharpGRPOTrainer from a YAML config: the same as ``sharpgrpo train``.

    python train.py --config configs/demo.yaml [--any_field value ...]
    accelerate launch --config_file configs/accelerate/zero3.yaml train.py --config configs/grpo_sg_kk_qwen2.5_3b.yaml

The command lives in the package (``sharpgrpo/cli/train.py``: the task's fields, the checks before the model loads,
the training and what a run leaves behind), so an installed package runs it as ``sharpgrpo train`` from any folder.
"""

from sharpgrpo.cli.train import cli

if __name__ == "__main__":
    cli()
