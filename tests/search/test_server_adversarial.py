"""Our retrieval server under bad requests and bad startups, with real HTTP on 127.0.0.1: each gets a 4xx with a
message or one clear line, and the server answers the next good request."""

import http.client
import json
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("uvicorn", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("bm25s", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")

from sharpgrpo.search.client import RetrievalClient
from sharpgrpo.search.server import RetrievalServerProcess

MAX_BODY_BYTES, MAX_QUERIES = 4 << 20, 1024

CORPUS = ['"Paris"\nParis is the capital of France.', '"Berlin"\nBerlin is the capital of Germany.']


def write_corpus(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_corpus(tmp_path_factory.mktemp("c") / "corpus.jsonl",
                        [json.dumps({"id": str(i), "contents": c}) for i, c in enumerate(CORPUS)])
    with RetrievalServerProcess(str(path), start_timeout=60) as url:
        yield url


def send(url, body: bytes, chunked=False):
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        if chunked:
            connection.request("POST", "/retrieve", body=iter([body]), encode_chunked=True,
                               headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        else:
            connection.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def good_request_works(url):
    status, body = send(url, json.dumps({"queries": ["capital of Germany"], "topk": 1}).encode())
    assert status == 200 and body["result"][0][0]["document"]["id"] == "1"


@pytest.mark.parametrize("raw", [
    b'{"queries": ["x"], "topk": NaN}', b'{"queries": ["x"], "topk": Infinity}', b'{"queries": ["x"], "topk": 1e400}',
    b'{"queries": [NaN], "topk": 1}', b'{"queries": ["x"], "topk": 2.5}', b'{"queries": ["x"], "return_scores": "maybe"}',
    b'not json', b'[]', b'{"queries": null}',
])
def test_malformed_values_get_422_with_a_message(server, raw):
    status, body = send(server, raw)
    assert status == 422 and isinstance(body["detail"], str) and body["detail"]
    good_request_works(server)


def test_too_many_queries_and_too_large_bodies_get_413(server):
    status, body = send(server, json.dumps({"queries": ["capital"] * (MAX_QUERIES + 1), "topk": 1}).encode())
    assert status == 413 and f"at most {MAX_QUERIES} queries" in body["detail"]
    status, body = send(server, json.dumps({"queries": ["x" * (MAX_BODY_BYTES + 1)]}).encode())
    assert status == 413 and "over the limit" in body["detail"]
    status, body = send(server, b'{"queries": ["x"]}', chunked=True)  # no Content-Length: size unknown
    assert status == 411
    good_request_works(server)
    # The most queries allowed are answered, and the client splits a larger batch into several requests.
    start = time.process_time()
    hits = RetrievalClient(server, timeout=30, retries=1).retrieve(["capital of France"] * (3 * MAX_QUERIES), topk=1)
    assert len(hits) == 3 * MAX_QUERIES and hits[-1][0]["document"]["id"] == "0"
    assert time.process_time() - start < 30


def start_error(path) -> str:
    with pytest.raises(RuntimeError) as error:
        RetrievalServerProcess(str(path), start_timeout=60).start()
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_bad_corpus_lines_are_named_in_one_line(tmp_path):
    good = json.dumps({"id": "0", "contents": CORPUS[0]})
    message = start_error(write_corpus(tmp_path / "a.jsonl", [good, "{not json"]))
    assert "exited with code 1" in message and "a.jsonl:2: not a JSON object" in message
    message = start_error(write_corpus(tmp_path / "b.jsonl", [good, json.dumps({"id": "1", "contents": None})]))
    assert "b.jsonl:2: `contents` must be a string" in message and "null" in message
    message = start_error(write_corpus(tmp_path / "c.jsonl", [good, "[1, 2]"]))
    assert "c.jsonl:2: a corpus row needs a `contents` field" in message


def run_cli(*args, timeout=60):
    command = [sys.executable, "-m", "sharpgrpo", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def test_busy_and_invalid_ports_fail_before_indexing(tmp_path):
    # The corpus is broken on line 2: a port error reported instead shows that the port is bound first.
    corpus = write_corpus(tmp_path / "c.jsonl", [json.dumps({"contents": CORPUS[0]}), "{broken"])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_cli("--corpus", str(corpus), "--port", str(port))
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith(f"error: Cannot listen on 127.0.0.1:{port}:")
    for bad in ("70000", "-1"):
        result = run_cli("--corpus", str(corpus), "--port", bad)
        assert result.returncode == 1 and result.stderr.strip() == (
            f"error: --port {bad} is not a port number (0-65535; 0 picks a free one).")
    result = run_cli("--corpus", str(corpus), "--port", "0")
    assert result.returncode == 1 and result.stderr.strip().startswith(f"error: {corpus}:2: not a JSON object")
