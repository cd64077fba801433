"""Our client, training's startup probe and ``sharpgrpo eval --task search_qa`` against a fake of Search-R1's own
retrieval server.

``SearchR1Server`` reproduces ``search_r1/search/retrieval_server.py`` of Search-R1 (commit a14dc3a):
* ``QueryRequest`` (lines 318-321): ``queries: List[str]``, ``topk: Optional[int] = None``, ``return_scores: bool =
  False``; a body that does not fit gets FastAPI's 422;
* ``retrieve_endpoint`` (lines 324-356): a missing or zero ``topk`` falls back to the server's ``--topk`` (3);
  ``results, scores = retriever.batch_search(..., return_score=request.return_scores)`` is unpacked whatever
  ``return_scores`` is, and ``batch_search`` returns ``(results, scores)`` only when asked for scores (lines
  195-205 and 241-271), else ``results`` alone. So without scores the unpacking raises (HTTP 500, FastAPI's plain
  ``Internal Server Error``) unless there are exactly two queries: then ``results`` is the first query's documents,
  ``scores`` the second's, and the answer is one flat list of documents. With scores each query gets
  ``[{"document": doc, "score": s}, ...]``, ``doc`` being the corpus row (``load_docs``, lines 34-36);
* there is no ``/health`` route (FastAPI's 404).
"""

import json
import threading
import typing
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sharpgrpo.search.client import RetrievalClient, RetrievalError
from sharpgrpo.search.format import format_passages

CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "2", "contents": '"Rome"\nRome is the capital city of Italy.'},
    {"id": "3", "contents": '"Eiffel Tower"\nThe Eiffel Tower is in Paris.'},
]
DEFAULT_TOPK = 3  # retrieval_server.py's --topk default


def batch_search(queries, num, return_score):
    """A word-overlap ranking standing in for e5/BM25, with upstream's return convention."""
    results, scores = [], []
    for query in queries:
        words = set(query.lower().split())
        ranked = sorted(range(len(CORPUS)), key=lambda i: (-len(words & set(CORPUS[i]["contents"].lower().split())), i))
        results.append([dict(CORPUS[i]) for i in ranked[:num]])
        scores.append([float(len(words & set(CORPUS[i]["contents"].lower().split()))) for i in ranked[:num]])
    return (results, scores) if return_score else results


class Handler(BaseHTTPRequestHandler):
    requests_seen: typing.ClassVar[list] = []

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(404, {"detail": "Not Found"})

    def do_POST(self):
        if self.path != "/retrieve":
            return self.reply(404, {"detail": "Not Found"})
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            queries, topk = request["queries"], request.get("topk")
            return_scores = request.get("return_scores", False)
            assert isinstance(queries, list) and all(isinstance(q, str) for q in queries)
            assert topk is None or isinstance(topk, int)
            assert isinstance(return_scores, bool)
        except (ValueError, KeyError, TypeError, AssertionError):
            return self.reply(422, {"detail": "validation error"})
        type(self).requests_seen.append(request)
        try:
            results, scores = batch_search(queries, topk or DEFAULT_TOPK, return_scores)
        except ValueError:  # "too many / not enough values to unpack"
            return self.reply(500, "Internal Server Error", "text/plain; charset=utf-8")
        response = []
        for i, single in enumerate(results):
            if return_scores:
                response.append([{"document": doc, "score": score} for doc, score in zip(single, scores[i])])
            else:
                response.append(single)
        self.reply(200, {"result": response})


@pytest.fixture
def search_r1_url():
    Handler.requests_seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def raw_post(url, body):
    request = urllib.request.Request(url + "/retrieve", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_fake_answers_like_search_r1_for_both_values_of_return_scores(search_r1_url):
    queries = ["capital of France", "capital of Germany", "capital of Italy"]
    assert raw_post(search_r1_url, {"queries": queries, "topk": 2, "return_scores": False}) == (
        500, "Internal Server Error")
    status, body = raw_post(search_r1_url, {"queries": queries[:2], "topk": 2, "return_scores": False})
    assert status == 200 and [type(x) for x in body["result"]] == [dict, dict]  # two documents, not two lists
    status, body = raw_post(search_r1_url, {"queries": queries, "topk": 2, "return_scores": True})
    assert status == 200 and [len(hits) for hits in body["result"]] == [2, 2, 2]
    assert set(body["result"][0][0]) == {"document", "score"}


def test_client_asks_for_scores_and_reads_search_r1_answers(search_r1_url):
    client = RetrievalClient(search_r1_url, timeout=5, retries=1)
    for queries in (["capital of France"], ["capital of France", "capital of Germany"], ["a", "b", "c"]):
        hits = client.retrieve(queries, topk=2)
        assert len(hits) == len(queries) and all(len(h) == 2 and "score" in h[0] for h in hits)
    assert all(request["return_scores"] is True for request in Handler.requests_seen)
    hits = client.retrieve(["capital of France"], topk=1)
    # Search-R1's _passages2string (llm_agent/generation.py lines 460-469), stripped as in execute_predictions
    assert format_passages(hits[0]) == "Doc 1(Title: \"Paris\") Paris is the capital and largest city of France."
    # Asked without scores, both of upstream's failures give one clear error instead of wrong passages.
    with pytest.raises(RetrievalError, match="HTTP 500"):
        client.retrieve(["a", "b", "c"], topk=2, return_scores=False)
    with pytest.raises(RetrievalError, match="a dict where a list of documents per query was expected"):
        client.retrieve(["a", "b"], topk=2, return_scores=False)


def test_bare_document_lists_are_accepted(search_r1_url):
    """The shape upstream would give without scores if its unpacking did not fail: bare documents per query."""
    client = RetrievalClient(search_r1_url, timeout=5, retries=1)
    assert client._documents([[CORPUS[0]], []], 2) == [[{"document": CORPUS[0]}], []]
    with pytest.raises(RetrievalError, match="without `contents`"):
        client._documents([[{"id": "9"}]], 1)


def test_run_startup_probe_passes_against_search_r1(search_r1_url):
    from sharpgrpo.search.config import SearchArguments
    from sharpgrpo.search.session import retrieval_session

    with retrieval_session(SearchArguments(retrieval_url=search_r1_url, retrieval_retries=1)) as client:
        assert client.retrieve(["Eiffel Tower Paris"], topk=1)[0][0]["document"]["id"] == "3"
    assert Handler.requests_seen[0]["return_scores"] is True  # the probe (no /health upstream)


def test_search_qa_eval_against_search_r1(tmp_path, search_r1_url, search_model_path):
    from sharpgrpo.evaluation import evaluate

    data = tmp_path / "nq.jsonl"
    data.write_text(json.dumps({"question": "capital of France", "golden_answers": ["Paris"]}) + "\n")
    result = evaluate(model=search_model_path, task="search_qa", data=[str(data)], output=str(tmp_path / "o.json"),
                      retrieval_url=search_r1_url, max_new_tokens=24, backend="transformers", progress=False)
    assert result["summary"]["search"]["turns_mean"] >= 1
    assert Handler.requests_seen and all(r["return_scores"] is True for r in Handler.requests_seen)
