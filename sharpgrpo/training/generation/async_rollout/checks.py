"""The settings asynchronous generation cannot serve, refused in one line when the config is built (before any model
loads)."""

from __future__ import annotations

from typing import Any


def check_async_config(args: Any) -> None:
    """Raise ``ConfigError`` naming the setting when ``async_generation`` is on with one it cannot serve yet
    (``max_staleness`` set while it is off is said once, as every field of a feature that is off: its
    ``acts_when``)."""
    from sharpgrpo.validation import ConfigError

    if not args.async_generation:
        return
    refused = [
        (args.use_vllm and args.vllm_mode != "server",
         f"vllm_mode={args.vllm_mode!r}: a colocated engine generates only when the trainer does; use "
         "vllm_mode='server' (a vLLM server generates ahead) or leave use_vllm off (a rollout process of its own)"),
        (args.dynamic_sampling, "dynamic_sampling: its refill rounds generate prompts the read-ahead cannot know"),
        (args.use_transformers_continuous_batching, "use_transformers_continuous_batching: the rollout process "
                                                    "runs transformers' generate"),
    ]
    for refused_here, why in refused:
        if refused_here:
            raise ConfigError(f"async_generation with {why}.")

