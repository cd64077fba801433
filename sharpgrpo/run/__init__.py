"""A training command's front end and lifetime: the config file and its parser, the checks of the command's inputs,
the output folder's guard, one-line errors, the lifecycle (signals, crash checkpoints, resume) and what a run
leaves behind (completions, progress bar, summary)."""
