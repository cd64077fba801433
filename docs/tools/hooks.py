"""MkDocs hook: the site's first page is the repository's README.md (one text, not a copy), with its links into
``docs/`` made relative to the site."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_as_index(text: str) -> str:
    """README.md's text as the site's ``index.md``: ``](docs/page.md...)`` links become ``](page.md...)``."""
    return re.sub(r"\]\(docs/", "](", text)


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "index.md", content=readme_as_index(README.read_text(encoding="utf-8"))))
    return files
