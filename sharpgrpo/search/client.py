"""HTTP client of a Search-R1-compatible retrieval server (``POST /retrieve``, ``GET /health``).

Requests ask for scores, as Search-R1's own client does (``llm_agent/generation.py``): Search-R1's
``retrieval_server.py`` unpacks ``results, scores`` unconditionally, so without scores it answers HTTP 500 (or, for
exactly two queries, a list of documents instead of one list per query). Both answer shapes are accepted: per query,
``[{"document": {...}, "score": s}, ...]`` or a bare ``[{"id", "contents"}, ...]``.

Standard library only. Every request has a timeout and a bounded number of attempts with backoff; when they are
spent the error names the URL and the last failure, so a dead or hung server stops training instead of hanging it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence


class RetrievalError(RuntimeError):
    """The retrieval server could not be reached or answered badly (after all retries)."""


class RetrievalClient:
    """``retrieve(queries, topk)`` -> per query, a list of ``{"document": {"id", "contents"}, "score"?}``; at most
    ``max_queries`` queries per request (our server refuses larger ones)."""

    max_queries = 512

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Retrieval URL must start with http:// or https://; got {url!r}.")
        self.url = url.rstrip("/")
        self.url = self.url.removesuffix("/retrieve")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.last_latency_ms = 0.0

    def _request(self, path: str, payload: dict | None, timeout: float) -> dict:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}, method="GET" if data is None else "POST"
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read().decode("utf-8"))

    def _documents(self, result, n_queries: int) -> list[list[dict]]:
        """``result`` as one list of ``{"document", "score"?}`` per query, or RetrievalError naming what is wrong."""
        where = f"Retrieval server {self.url}/retrieve"
        if not isinstance(result, list) or len(result) != n_queries:
            size = len(result) if isinstance(result, list) else type(result).__name__
            raise RetrievalError(f"{where} returned {size} results for {n_queries} queries.")
        out = []
        for hits in result:
            if not isinstance(hits, list):
                raise RetrievalError(f"{where} returned a {type(hits).__name__} where a list of documents per query "
                                     "was expected.")
            items = []
            for hit in hits:
                item = hit if isinstance(hit, dict) and "document" in hit else {"document": hit}
                if not isinstance(item["document"], dict) or "contents" not in item["document"]:
                    raise RetrievalError(f"{where} returned a document without `contents`: {str(hit)[:200]}")
                items.append(item)
            out.append(items)
        return out

    def health(self, timeout: float = 2.0) -> bool:
        try:
            return self._request("/health", None, timeout).get("status") == "ok"
        except (OSError, ValueError):
            return False

    def retrieve(self, queries: Sequence[str], topk: int, return_scores: bool = True) -> list[list[dict]]:
        """Per query, ``[{"document": {"id", "contents", ...}, "score"?: float}, ...]``, whichever shape the server
        answered in."""
        if not queries:
            return []
        if len(queries) > self.max_queries:
            return [hits for start in range(0, len(queries), self.max_queries)
                    for hits in self.retrieve(queries[start : start + self.max_queries], topk, return_scores)]
        payload = {"queries": list(queries), "topk": int(topk), "return_scores": bool(return_scores)}
        last_error: Exception | None = None
        start = time.perf_counter()
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                result = self._request("/retrieve", payload, self.timeout)["result"]
            except urllib.error.HTTPError as error:
                body = error.read().decode("utf-8", "replace")[:300]
                if 400 <= error.code < 500:  # our request is wrong: retrying cannot help
                    raise RetrievalError(f"Retrieval server {self.url}/retrieve refused the request: HTTP {error.code} {body}") from error
                last_error = RuntimeError(f"HTTP {error.code} {body}")
                continue
            except (OSError, ValueError, KeyError) as error:  # refused, reset, timed out, not JSON
                last_error = error
                continue
            documents = self._documents(result, len(queries))
            self.last_latency_ms = 1000.0 * (time.perf_counter() - start)
            return documents
        raise RetrievalError(
            f"Retrieval server {self.url}/retrieve failed {self.retries} time(s) (timeout {self.timeout:g}s each); "
            f"last error: {type(last_error).__name__}: {last_error}. Is the server running and reachable?"
        )
