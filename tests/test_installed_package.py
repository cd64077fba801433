"""``sharpgrpo train`` from an installed wheel, away from the source checkout: the command lives in the package and
the shipped configs are found by name, as ``trl grpo`` works from any install.

The wheel is built from a copy of this checkout (``pip wheel .``) and installed non-editable into a fresh virtual environment;
its dependencies (torch, TRL, ...) come from the test's own environment through a path file, so that nothing is
downloaded. The command then runs in an empty folder with no ``PYTHONPATH``.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's python, its `sharpgrpo` command)."""
    root = tmp_path_factory.mktemp("installed")
    source, wheels = root / "source", root / "wheels"  # a clean copy: no stale build/ of an earlier layout
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "outputs", ".pytest_cache"))  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, cwd=root)  # fmt: skip
    (wheel,) = wheels.glob("sharpgrpo-*.whl")
    env_dir = root / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True)  # fmt: skip
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    # The dependencies of this environment, after the fresh one's own packages (a path, not a site dir: the
    # editable install's path hook in this environment is not run there).
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, env_dir / "bin" / "sharpgrpo"


def run_from(folder: Path, *command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_the_package_is_the_installed_one(installed, tmp_path):
    python, _ = installed
    done = run_from(tmp_path, str(python), "-c", "import sharpgrpo, reward_fns; print(sharpgrpo.__file__)")
    assert done.returncode == 0, done.stderr
    assert str(REPO) not in done.stdout and "site-packages" in done.stdout


def test_train_runs_a_copied_config_from_another_folder(installed, tmp_path):
    _, sharpgrpo = installed
    config = tmp_path / "my_demo.yaml"
    shutil.copy(REPO / "configs" / "demo.yaml", config)
    done = run_from(tmp_path, str(sharpgrpo), "train", "--config", str(config), "--max_steps", "2",
                    "--output_dir", "out", "--plot", "false")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_a_shipped_config_by_name(installed, tmp_path):
    _, sharpgrpo = installed
    done = run_from(tmp_path, str(sharpgrpo), "train", "--config", "demo", "--max_steps", "1", "--output_dir", "out",
                    "--plot", "false")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 1
    unknown = run_from(tmp_path, str(sharpgrpo), "train", "--config", "demoo")
    assert unknown.returncode == 1
    assert "error: --config='demoo': no such file, and no shipped config of that name (shipped: " in unknown.stderr
    assert "demo, " in unknown.stderr and "Traceback" not in unknown.stderr
