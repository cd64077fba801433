"""HTTP client of a Search-R1-compatible retrieval server (``POST /retrieve``, ``GET /health``).

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
    """``retrieve(queries, topk)`` -> per query, a list of ``{"document": {"id", "contents"}, "score"?}``."""

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

    def health(self, timeout: float = 2.0) -> bool:
        try:
            return self._request("/health", None, timeout).get("status") == "ok"
        except (OSError, ValueError):
            return False

    def retrieve(self, queries: Sequence[str], topk: int, return_scores: bool = False) -> list[list[dict]]:
        if not queries:
            return []
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
            if len(result) != len(queries):
                raise RetrievalError(
                    f"Retrieval server {self.url}/retrieve returned {len(result)} results for {len(queries)} queries."
                )
            self.last_latency_ms = 1000.0 * (time.perf_counter() - start)
            return [list(documents) for documents in result]
        raise RetrievalError(
            f"Retrieval server {self.url}/retrieve failed {self.retries} time(s) (timeout {self.timeout:g}s each); "
            f"last error: {type(last_error).__name__}: {last_error}. Is the server running and reachable?"
        )
