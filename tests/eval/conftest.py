"""Fixtures of the evaluation tests. The tiny model comes from the session fixture ``tiny_model_path``
(tests/conftest.py), built once per test session."""

from __future__ import annotations

import pytest

from sharpgrpo.paths import shared_data_dir


@pytest.fixture(scope="session")
def shared_kk_dir():
    directory = shared_data_dir("kk")
    if directory is None:
        pytest.skip("shared/data/kk is not available (set $SHARPGRPO_SHARED_DIR to the shared folder).")
    return directory


@pytest.fixture(scope="session")
def shared_math_dir():
    directory = shared_data_dir("math")
    if directory is None:
        pytest.skip("shared/data/math is not available (set $SHARPGRPO_SHARED_DIR to the shared folder).")
    return directory
