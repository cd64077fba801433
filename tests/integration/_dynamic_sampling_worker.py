"""Two steps of the tiny model with dynamic sampling, under ``accelerate launch`` with several processes
(tests/integration/test_dynamic_sampling.py). Every process writes ``OUT/rank<k>.json``: the total rewards of each
generation batch it trained on (its own rows, from the joined generation record's gathered rewards) and the logged
dynamic-sampling metrics."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from helpers import make_trainer, tiny_config  # noqa: E402  tests/ is on PYTHONPATH under accelerate launch

from sharpgrpo import SharpGRPOTrainer  # noqa: E402


def solved_often_reward(prompts, completions, allowed, **kwargs):
    """As test_dynamic_sampling.solved_often_reward: most groups of the warm-started tiny model are all 1."""
    from sharpgrpo.data.demo import allowed_letters_reward

    return [float(r >= 0.25) for r in allowed_letters_reward(prompts, completions, allowed)]


class RecordingTrainer(SharpGRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            rows = output["completion_ids"].size(0)
            start = self.accelerator.process_index * rows
            rewards = self._generation.rewards_per_func[:, 0]
            self.recorded.append({"local": rewards[start:start + rows].tolist(), "global": rewards.tolist(),
                                  "rows": rows})
        return output


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--output_dir", required=True)
    options = parser.parse_args()
    out = Path(options.output_dir)
    args = tiny_config(out / "run", per_device_train_batch_size=8, num_generations=4, max_steps=2,
                       dynamic_sampling=True, dynamic_sampling_max_rounds=6)
    trainer = make_trainer(options.model, args, reward_funcs=[solved_often_reward], train_dataset=64,
                           trainer_class=RecordingTrainer)
    trainer.recorded = []
    trainer.train()
    metrics = [{k: v for k, v in entry.items() if k.startswith("dynamic_sampling/")}
               for entry in trainer.state.log_history if "dynamic_sampling/extra_rounds" in entry]
    rank = trainer.accelerator.process_index
    (out / f"rank{rank}.json").write_text(json.dumps({"batches": trainer.recorded, "metrics": metrics}))


if __name__ == "__main__":
    main()
