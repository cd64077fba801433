"""The retrieval server a run talks to: a user's (``retrieval_url``) or one started here from ``retrieval_corpus``.

With several processes, local process 0 of each node starts the server on 127.0.0.1 and writes its port to
``{output_dir}/retrieval_server.{host}.port``; the node's other processes wait for that file and ``/health``. The
server is stopped when the ``with`` block exits, also on an error, Ctrl-C or SIGTERM (and exits by itself if its parent
dies).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sharpgrpo.search.client import RetrievalClient
from sharpgrpo.search.config import SearchArguments


def _port_file(output_dir: str) -> Path:
    return Path(output_dir) / f"retrieval_server.{socket.gethostname()}.port"


def _sigterm_as_exit():
    """Make SIGTERM (sent by launchers to stop workers) raise SystemExit, so that ``finally`` stops the server; return
    a function restoring the previous handler. Only in the main thread (where Python delivers signals)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):  # someone else handles it already
        return lambda: None

    def exit_on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def retrieval_session(search_args: SearchArguments, output_dir: str = ".", local_process_index: int = 0) -> Iterator[RetrievalClient]:
    """Yield a ``RetrievalClient`` for the configured server (see the module docstring)."""
    from sharpgrpo.search.data import resolve_corpus

    def client(url: str) -> RetrievalClient:
        return RetrievalClient(url, timeout=search_args.retrieval_timeout, retries=search_args.retrieval_retries)

    if search_args.retrieval_url:
        remote = client(search_args.retrieval_url)
        if not remote.health(timeout=search_args.retrieval_timeout):  # Search-R1's server has no /health: probe
            remote.retrieve(["health check"], topk=1)  # raises RetrievalError naming the URL
        yield remote
        return
    if not search_args.retrieval_corpus:
        raise ValueError("Search needs `retrieval_url` or `retrieval_corpus`.")
    port_file = _port_file(output_dir)
    if local_process_index == 0:
        from sharpgrpo.search.server import RetrievalServerProcess

        port_file.parent.mkdir(parents=True, exist_ok=True)
        port_file.unlink(missing_ok=True)
        restore_sigterm = _sigterm_as_exit()
        server = RetrievalServerProcess(resolve_corpus(search_args.retrieval_corpus), search_args.retriever,
                                        start_timeout=search_args.server_start_timeout)
        try:
            url = server.start()
            port_file.write_text(url)
            yield client(url)
        finally:
            server.stop()
            port_file.unlink(missing_ok=True)
            restore_sigterm()
        return
    deadline = time.monotonic() + search_args.server_start_timeout
    while time.monotonic() < deadline:
        if port_file.exists():
            url = port_file.read_text().strip()
            if url and RetrievalClient(url).health(timeout=1.0):
                yield client(url)
                return
        time.sleep(0.5)
    raise TimeoutError(
        f"No retrieval server answered within {search_args.server_start_timeout:g}s (waiting for {port_file} from "
        "local process 0)."
    )


def search_rollout(search_args: SearchArguments, client: RetrievalClient):
    """TRL ``rollout_func`` running Search-R1 episodes against ``client``."""
    from sharpgrpo.search.rollout import SearchRolloutFunc

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    return SearchRolloutFunc(client, search_args)
