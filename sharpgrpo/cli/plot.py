"""Training curves of one or more runs, per step: ``sharpgrpo plot RUN_DIR [RUN_DIR ...] --output DIR``.

Reads each run's ``trainer_state.json`` (the run folder, its latest ``checkpoint-N``, or the file itself) and writes
one PNG per metric group that any run logged, comparing the runs:

* ``reward.png``: ``reward`` and each reward function's ``rewards/<name>/mean``;
* ``grad_norm.png``: ``grad_norm`` with spikes (values above ``spike_factor`` x the run's median) marked, as in the
  papers' gradient-norm figures (GRPO-SG Figure 1, TR-GRPO Figure 3);
* ``entropy.png``: policy entropy (and ``kl`` when logged);
* ``token_weight.png``: ``token_weight/mean|std|min|max|frac_at_lower|frac_at_upper``;
* ``clipping.png``: ``clip_ratio/low_mean|high_mean|region_mean`` and ``token_weight/frac_grad_clipped``;
* ``sharpness.png``: the sharpness probe's ``sharpness/*``; ``strategy.png``: every metric the runs' strategies
  logged, one panel each: any ``NAMESPACE/name`` outside the trainer's own namespaces (``cw/*``, ``thr/*``,
  ``gtpo/*``, ``clip_cov/*``, ... and those of a strategy you register; ``curve_plots.strategy_keys``);

plus ``grad_norm_summary.json`` / ``.md``: per run, the grad-norm mean, std, coefficient of variation, median, max
and the number of spikes. The same as ``python -m sharpgrpo plot``; the figures are drawn by
``sharpgrpo.diagnostics.curve_plots`` from the series of ``sharpgrpo.diagnostics.curves``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sharpgrpo.diagnostics.curve_plots import grad_norm_markdown, plot_runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from sharpgrpo.run.command_line import CommandParser, check_output_folder
    from sharpgrpo.validation import ConfigError, between, positive

    parser = CommandParser(prog="sharpgrpo plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", path="exists", help="Run folders (or trainer_state.json files).")
    parser.add_argument("--output", required=True, help="Folder for the PNGs and the grad-norm summary.")
    parser.add_argument("--labels", nargs="+", default=None, help="Legend names, one per run (default: folder names).")
    parser.add_argument(
        "--smooth", type=float, default=0.0, rule=between(0, 1, high_open=True),
        help="EMA weight in (0, 1) of an overlaid smoothed curve; 0: raw only.",
    )  # fmt: skip
    parser.add_argument(
        "--spike_factor", type=float, default=3.0, rule=positive(),
        help="A grad norm above this x the run's median is a spike.",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.runs):
        raise ConfigError(f"--labels={args.labels}: {len(args.labels)} label(s) for {len(args.runs)} run(s); give "
                          "one per run.")  # fmt: skip
    check_output_folder("--output", args.output, command=parser.prog)  # run.output_dir: the rule of every writer
    from sharpgrpo.diagnostics.curves import load_log_history
    from sharpgrpo.run.output_dir import claim_output_target

    for run in args.runs:  # every input read before the folder is claimed: a refusal creates nothing
        load_log_history(run)

    claim_output_target(args.output, command=parser.prog, config=vars(args), argv=argv)
    result = plot_runs(args.runs, args.output, args.labels, args.smooth, args.spike_factor)
    print(grad_norm_markdown(result["grad_norm"], args.spike_factor))
    print("Wrote " + ", ".join(Path(f).name for f in result["files"]))
    return result


if __name__ == "__main__":
    from sharpgrpo.run.errors import one_line_errors

    with one_line_errors():  # one line per error; --debug or SHARPGRPO_DEBUG=1 for the traceback
        main()
