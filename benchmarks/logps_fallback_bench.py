"""Peak memory of the sampling log-probabilities computed from hidden states at long context.

Compares, for B rows of L tokens, vocabulary V and hidden size H (fp32, no grad):

* ``sharpgrpo``: ``sharpgrpo.training.generation.capture.logps_from_hidden_states`` (vocabulary slices with an online
  log-normaliser, at most ``chunk_size x V`` logits alive; default chunk_size 512);
* ``trl``: TRL 1.16's own fused head kernel, ``trl.kernels.chunked_logprob.ChunkedLogProbFunction`` (what
  ``GRPOTrainer._get_per_token_logps_and_entropies`` runs through ``fused_lm_head=True``), with TRL's vocabulary
  chunk ``_CHUNKED_LOGPROB_CHUNK_SIZE`` (32768) and 4096-token tiles;
* the previous fallback, ``rows_per_chunk x L x V`` fp32 logits, is given by arithmetic (it is not run: 20 GB at
  8 x 4096 x 151,936);
* ``otb``: the optimal token baseline's statistic sum_{v != y} p(v)^2
  (``sharpgrpo.strategies.optimal_baseline.sum_p_squared`` with the strategy's defaults: 8 rows x 8192 vocabulary
  entries per tile, ``exclude_ids`` the sampled tokens), against ``trl_otb``: TRL's fused head asked for the same
  statistic (``outputs=("log_sum_sq_probs",)``, then minus p(y)^2).

Each method runs in a fresh process; the peak is the growth of the process's peak resident set (``ru_maxrss``)
over its value just before the call, so it counts the call's temporaries, not the inputs. Also checks that the two
give the same log-probabilities (max abs difference).

    OMP_NUM_THREADS=1 python benchmarks/logps_fallback_bench.py                 # L=4096 V=151936 H=64 B=1
    OMP_NUM_THREADS=1 python benchmarks/logps_fallback_bench.py --rows 2 --hidden 128
    OMP_NUM_THREADS=1 python benchmarks/logps_fallback_bench.py --rows 8 --otb      # with OTB's statistic
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(method: str, rows: int, length: int, vocab: int, hidden_size: int, chunk_size: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, length, hidden_size, generator=generator)
    weight = torch.randn(vocab, hidden_size, generator=generator) / hidden_size**0.5
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    before = peak_mib()
    start = time.process_time()
    with torch.no_grad():
        if method == "sharpgrpo":
            from sharpgrpo.training.generation.capture import logps_from_hidden_states

            out = logps_from_hidden_states(hidden, ids, weight, None, 1.0, rows_per_chunk=8, chunk_size=chunk_size)
        elif method == "otb":
            from sharpgrpo.strategies.optimal_baseline import sum_p_squared

            out = sum_p_squared(hidden, weight, None, 1.0, rows_per_chunk=8, exclude_ids=ids)
        else:
            from trl.kernels.chunked_logprob import ChunkedLogProbFunction
            from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

            outputs = ("log_sum_sq_probs",) if method == "trl_otb" else ()
            logps, _, log_sum_sq, *_ = ChunkedLogProbFunction.apply(
                hidden.reshape(-1, hidden_size), weight, None, ids.reshape(-1), 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE,
                None, 1.0, outputs)
            out = logps if method == "trl" else log_sum_sq.exp() - (2 * logps).exp()
            out = out.view(rows, length)
    seconds = time.process_time() - start
    return {"method": method, "peak_mib": peak_mib() - before, "cpu_s": seconds, "sum": float(out.double().sum()),
            "first": out[0, :8].tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--otb", action="store_true", help="also OTB's statistic (methods otb and trl_otb)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    shape = (cli.rows, cli.length, cli.vocab, cli.hidden, cli.chunk_size)
    if cli.one:
        print(json.dumps(run_one(cli.one, *shape)))
        return
    results = []
    for method in ("sharpgrpo", "trl", *(("otb", "trl_otb") if cli.otb else ())):
        command = [sys.executable, __file__, "--one", method, "--rows", str(cli.rows), "--length", str(cli.length),
                   "--vocab", str(cli.vocab), "--hidden", str(cli.hidden), "--chunk-size", str(cli.chunk_size)]
        results.append(json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout))
    full = 8 * cli.length * cli.vocab * 4 / 2**20
    print(f"B={cli.rows} L={cli.length} V={cli.vocab} H={cli.hidden} chunk_size={cli.chunk_size}")
    print("| method | peak memory above inputs | CPU time |")
    print("|---|---|---|")
    for r in results:
        print(f"| {r['method']} | {r['peak_mib']:.0f} MiB | {r['cpu_s']:.1f} s |")
    print(f"| previous fallback (8 rows x L x V fp32 logits, arithmetic) | {full:.0f} MiB | - |")
    print(f"sum of log-probabilities: sharpgrpo {results[0]['sum']:.6f}, trl {results[1]['sum']:.6f}; "
          f"first tokens {results[0]['first'][:3]} vs {results[1]['first'][:3]}")
    if cli.otb:
        print(f"sum of sum_(v != y) p(v)^2: otb {results[2]['sum']:.9f}, trl_otb {results[3]['sum']:.9f}; "
              f"first tokens {results[2]['first'][:3]} vs {results[3]['first'][:3]}")


if __name__ == "__main__":
    main()
