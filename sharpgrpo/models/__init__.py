"""Models by name: the prepared models (``sharpgrpo-tiny`` built locally, ``sharpgrpo-smol`` fetched from PyPI) and
the check of where a model comes from (a model folder, a prepared name or a Hub id)."""
