"""Serve a Search-R1 corpus for retrieval (``sharpgrpo serve``, or ``python -m sharpgrpo serve``)::

    sharpgrpo serve --corpus corpus.jsonl [--retriever bm25] [--host 127.0.0.1 --port 0 --port_file F]

The server, its API and its indexes are ``sharpgrpo.search.server``'s; training and ``sharpgrpo eval --task
search_qa`` start it themselves (``RetrievalServerProcess``). Needs the ``search`` extra.
"""

import argparse
import sys

from sharpgrpo.search.server import MAX_BODY_BYTES, MAX_QUERIES, StartupError, serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].rstrip(":"))
    parser.add_argument("--corpus", required=True, help="Search-R1 corpus .jsonl ({id, contents} per line).")
    parser.add_argument("--retriever", default="bm25", choices=["bm25", "dense"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port_file).")
    parser.add_argument("--port_file", default=None, help="Write the bound port here once the index is built.")
    parser.add_argument("--max_queries", type=int, default=MAX_QUERIES, help="Most queries per request (else 413).")
    parser.add_argument("--max_body_bytes", type=int, default=MAX_BODY_BYTES, help="Largest request body (else 413).")
    parser.add_argument("--parent_pid", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        serve(args.corpus, args.retriever, args.host, args.port, args.port_file, args.parent_pid, args.max_queries,
              args.max_body_bytes)
    except StartupError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
