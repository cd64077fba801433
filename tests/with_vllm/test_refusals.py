"""``use_vllm=True`` requests that cannot work are refused in one line naming the setting, before the model loads
(sharpgrpo/training/generation/vllm_checks.py). These run in the default suite, where vLLM is not installed."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from vllm_marks import VLLM_MISSING

from sharpgrpo.training.generation import vllm_checks
from sharpgrpo.validation import ConfigError


def vllm_args(**overrides):
    values = dict(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=False, vllm_server_base_url=None,
                  vllm_server_host="127.0.0.1", vllm_server_port=8000, vllm_server_timeout=240.0,
                  generation_kwargs=None, num_generations=8)
    return SimpleNamespace(**{**values, **overrides})


def refusal(call) -> str:
    with pytest.raises(ConfigError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.skipif(not VLLM_MISSING, reason="vLLM is installed in this environment")
def test_use_vllm_without_vllm_installed():
    message = refusal(lambda: vllm_checks.check_vllm_request(vllm_args()))
    assert message.startswith("use_vllm=True: vLLM is not installed") and '".[vllm]"' in message


def test_no_request_without_use_vllm():
    vllm_checks.check_vllm_request(vllm_args(use_vllm=False, vllm_mode="server"))  # nothing is checked


@pytest.mark.parametrize("version", ["0.21.0", "0.32.0", "1.0.0"])
def test_a_vllm_outside_trls_range(monkeypatch, version):
    monkeypatch.setattr(vllm_checks, "installed_vllm_version", lambda: version)
    message = refusal(lambda: vllm_checks.check_vllm_request(vllm_args(), cuda_available=True))
    assert f"vLLM {version} is installed, but TRL 1.16 supports vLLM 0.22.0 to 0.31.0" in message


@pytest.mark.parametrize("version", ["0.22.0", "0.31.0", "0.31.0+cpu"])
def test_a_vllm_inside_trls_range_passes(monkeypatch, version):
    monkeypatch.setattr(vllm_checks, "installed_vllm_version", lambda: version)
    vllm_checks.check_vllm_request(vllm_args(), cuda_available=True)


def test_sleep_mode_without_cuda(monkeypatch):
    monkeypatch.setattr(vllm_checks, "installed_vllm_version", lambda: "0.31.0")
    message = refusal(lambda: vllm_checks.check_vllm_request(vllm_args(vllm_enable_sleep_mode=True),
                                                               cuda_available=False))
    assert message.startswith("vllm_enable_sleep_mode=True")


@contextmanager
def answering_server(server_info: dict | None):
    """An HTTP server on a free port that answers ``/health`` and ``/server_info`` as a vLLM server does: the
    resolved config (``{"vllm_config": ...}``) in development mode, 404 without it (``server_info=None``). The
    server's own answers are tested for real in test_server_mode.py."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/server_info" and server_info is None:
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps({"vllm_config": server_info} if path == "/server_info" else {}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("server_info, cuda, expected", [
    (None, False, "has no weight-update endpoints (it runs without VLLM_SERVER_DEV_MODE=1)"),
    ({"weight_transfer_config": None}, True, "has no weight-transfer engine"),
    ({"weight_transfer_config": {"backend": "nccl"}}, False, "takes weights through 'nccl', which needs CUDA"),
])
def test_a_server_the_trainer_cannot_push_weights_to(monkeypatch, server_info, cuda, expected):
    monkeypatch.setattr(vllm_checks, "installed_vllm_version", lambda: "0.31.0")
    with answering_server(server_info) as url:
        message = refusal(lambda: vllm_checks.check_vllm_request(
            vllm_args(vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=5), cuda_available=cuda))
    assert message.startswith(f"vllm_mode='server': the vLLM server at {url} {expected}")
    assert "sharpgrpo vllm-serve --model <model>" in message


def test_an_nccl_server_passes_with_cuda(monkeypatch):
    monkeypatch.setattr(vllm_checks, "installed_vllm_version", lambda: "0.31.0")
    with answering_server({"weight_transfer_config": {"backend": "nccl"}}) as url:
        vllm_checks.check_vllm_request(vllm_args(vllm_mode="server", vllm_server_base_url=url,
                                                 vllm_server_timeout=5), cuda_available=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_server_is_refused_after_its_timeout(monkeypatch):
    monkeypatch.setattr(vllm_checks, "installed_vllm_version", lambda: "0.31.0")
    port = free_port()  # nothing listens there
    start = time.monotonic()
    message = refusal(lambda: vllm_checks.check_vllm_request(
        vllm_args(vllm_mode="server", vllm_server_port=port, vllm_server_timeout=1.0), cuda_available=True))
    assert time.monotonic() - start < 10
    assert message.startswith("vllm_server_host/vllm_server_port: no vLLM server answers at "
                              f"http://127.0.0.1:{port}/health within vllm_server_timeout=1 s")
    message = refusal(lambda: vllm_checks.check_vllm_request(
        vllm_args(vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{port}", vllm_server_timeout=0.5),
        cuda_available=True))
    assert message.startswith("vllm_server_base_url: no vLLM server answers")


@pytest.mark.skipif(not VLLM_MISSING, reason="vLLM is installed in this environment")
def test_sharpgrpo_train_with_use_vllm_and_no_vllm_stops_in_one_line_and_writes_nothing(tmp_path, capsys,
                                                                                         monkeypatch):
    import sys

    from sharpgrpo.cli import main

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    output = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main(["train", "--config", "demo", "--use_vllm", "true", "--output_dir", str(output)])
    assert stop.value.code not in (0, None)
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("error: use_vllm=True: vLLM is not installed"), lines[-3:]
    assert not output.exists()  # refused before the output folder (and the model) was touched
