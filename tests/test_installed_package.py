"""Every documented command from an installed wheel, away from the source checkout: ``sharpgrpo train``, ``compare``,
``eval``, ``plot``, ``tokens`` and ``serve`` (and the README's ``accelerate launch -m sharpgrpo train`` form's
module), a few steps each; the commands live in the package and the shipped configs are found by name, as ``trl
grpo`` works from any install.

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
import time
import urllib.request
import venv
from pathlib import Path

import pytest

# Builds a wheel and runs every command (about 2 minutes on 2 cores): `python -m pytest -q -m installed`, as CI does
# (.ci/run), left out of the default run.
pytestmark = pytest.mark.installed

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
    assert "error: --config='demoo': no such file, and no shipped config of that name" in unknown.stderr
    assert "(shipped: " in unknown.stderr
    assert "demo, " in unknown.stderr and "Traceback" not in unknown.stderr


@pytest.fixture(scope="module")
def trained_run(installed, tmp_path_factory):
    """A 2-step demo run of the installed `sharpgrpo train` in an empty folder, with saved completions and token
    telemetry (what `sharpgrpo tokens` reads): (the folder, the run's folder)."""
    _, sharpgrpo = installed
    folder = tmp_path_factory.mktemp("user")
    done = run_from(folder, str(sharpgrpo), "train", "--config", "demo", "--max_steps", "2", "--output_dir", "run",
                    "--token_telemetry", "true", "--strategies", "grpo_sg,thr")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, folder / "run"


def test_train_writes_the_curves_of_its_strategy(trained_run):
    _, run = trained_run
    assert (run / "training_curves.png").stat().st_size > 0
    assert (run / "completions").is_dir() and (run / "telemetry").is_dir()


def test_compare_runs_and_reports_a_failed_runs_error_line(installed, tmp_path):
    """`sharpgrpo compare` from the wheel (which has no train.py): its runs train, and a run that fails inside the
    comparison shows its own error line in the report."""
    _, sharpgrpo = installed
    # passes compare's checks before any run, fails in the run's prompt-length check against the model's context
    bad = "equal:max_completion_length=5000"
    done = run_from(tmp_path, str(sharpgrpo), "compare", "--config", "demo", "--strategies", "equal", bad,
                    "--seeds", "0", "--output", "report", "--set", "max_steps=1")  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    statuses = {r["strategy"]: r["status"] for r in summary["runs"]}
    assert statuses == {"equal": "done", "equal (max_completion_length=5000)": "failed"}
    report = (tmp_path / "report" / "report.md").read_text()
    assert "equal (max_completion_length=5000) seed 0: sharpgrpo train exited with code 1: error: " in report
    (failed,) = [r for r in summary["runs"] if r["status"] == "failed"]
    assert "max_completion_length" in failed["error"], failed["error"]
    assert "max_completion_length" in done.stderr and "Traceback" not in done.stderr
    assert summary["runs"][0]["metrics"]["steps"] == 1


def test_eval_plot_and_tokens_on_the_run(installed, trained_run):
    _, sharpgrpo = installed
    folder, _ = trained_run
    done = run_from(folder, str(sharpgrpo), "eval", "--model", "run", "--task", "kk", "--limit", "1",
                    "--max_new_tokens", "4", "--output", "results/kk.json")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((folder / "results" / "kk.json").read_text())
    done = run_from(folder, str(sharpgrpo), "plot", "run", "--output", "plots")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (folder / "plots" / "reward.png").is_file() and (folder / "plots" / "strategy.png").is_file()
    done = run_from(folder, str(sharpgrpo), "tokens", "--model", "run", "--completions", "run/completions",
                    "--output", "tokens", "--max_rows", "32", "--strategy", "grpo_sg")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (folder / "tokens" / "tokens.html").is_file()
    done = run_from(folder, str(sharpgrpo), "tokens", "--telemetry", "run", "--output", "telemetry_page")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (folder / "telemetry_page" / "tokens.html").is_file()


def test_serve_answers_health_and_retrieve(installed, tmp_path):
    _, sharpgrpo = installed
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"Doc {i}"\n{text}'}) + "\n" for i, text in
                              enumerate(["paris is the capital of france", "berlin is in germany", "rome"])))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen([str(sharpgrpo), "serve", "--corpus", str(corpus), "--port", "0", "--port_file",
                               "port"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "port").is_file() or not (tmp_path / "port").read_text().strip():
            assert server.poll() is None, server.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no port file after 120 s"
            time.sleep(0.2)
        url = f"http://127.0.0.1:{int((tmp_path / 'port').read_text())}"
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=30).read())
        assert health["status"] == "ok" and health["documents"] == 3
        request = urllib.request.Request(url + "/retrieve", data=json.dumps({"queries": ["capital of france"],
                                         "topk": 1}).encode(), headers={"Content-Type": "application/json"})  # fmt: skip
        result = json.loads(urllib.request.urlopen(request, timeout=30).read())["result"]
        assert result[0][0]["document"]["id"] == "0"
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_the_module_form_accelerate_launches(installed, tmp_path):
    """`accelerate launch -m sharpgrpo train ...` (README) runs `python -m sharpgrpo train`: the same command."""
    python, _ = installed
    done = run_from(tmp_path, str(python), "-m", "sharpgrpo", "train", "--config", "demo", "--max_steps", "1",
                    "--output_dir", "out", "--plot", "false")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 1
