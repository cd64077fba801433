"""Strategies compared across seeds (the ``sharpgrpo compare`` command, ``sharpgrpo.cli.compare``): ``runs`` plans and
executes the (strategy, seed) ``train.py`` runs, ``stats`` computes per-run metrics and the intervals and paired
differences over seeds, ``report`` writes ``report.md``, ``summary.json`` and the band plots."""
