"""What the trainer's hooks call, grouped by the hook: ``generation/`` (advantage strategies and their inputs),
``loss/`` (the policy loss as one function), ``telemetry/`` (per-token telemetry). Beside them: the configured
strategies as one object (``strategy_set``), strategy state in checkpoints, the launch checks, the model card and the
checks of what strategies and reward functions return."""
