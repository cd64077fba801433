"""What the trainer hands to telemetry: the per-token telemetry files (``recorder``) and the completion tables' trained
advantages."""
