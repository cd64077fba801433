"""``python -m sharpgrpo SUBCOMMAND ...``: the same as the ``sharpgrpo`` command (`sharpgrpo.cli`)."""

from sharpgrpo.cli import main

if __name__ == "__main__":
    main()
