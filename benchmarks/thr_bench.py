"""Benchmark of the THR score computation (sharpgrpo.strategies.thr.token_hidden_reward_scores, docs/methods.md §3).

For one synthetic group of G completions of equal length L (N = G*L tokens, a fraction of the completions positive,
nP = |P|*L P-tokens) it measures, per method (``fused``, ``factored``, ``pairwise``, ``auto``):

* time (single-threaded CPU: process CPU time, see :func:`measure`) and peak extra memory of the score
  computation (CUDA: ``torch.cuda.max_memory_allocated`` above the memory in use before the call; CPU: peak
  resident set size above the one before the call, from Linux's VmHWM after resetting it through
  /proc/self/clear_refs, with glibc told to return large frees to the OS; "n/a" where that is not available);
* next to it, the time of one no-grad pass of the same N hidden states through the unembedding (logits h @ W^T for
  all tokens, in the input dtype), as a proxy for the LM-head part of a forward pass (its peak memory is the
  (N, V) logits tensor);
* the flop count of the pairwise vocabulary product ``2 * nP * N * V`` (the floor of the pairwise formulation), the
  method's own flop count (logsumexp pass + score pass), and the achieved fractions of the machine's measured matmul
  rate: ``floor / time / rate`` and ``method flops / time / rate`` (the factored method does fewer flops than the
  pairwise floor when nP N > H (N + nP), so its floor fraction can exceed 1).

Examples:
    python benchmarks/thr_bench.py                       # small CPU shapes, about a minute on one core
    python benchmarks/thr_bench.py --device cuda --dtype bfloat16 --vocab 151936 --hidden 1536 \\
        --lengths 512 1024 2048 4096 --matmul-dtype bfloat16   # the GPU target (Qwen2.5-1.5B sizes)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sharpgrpo.strategies import thr_kernels  # noqa: E402
from sharpgrpo.strategies.thr import token_hidden_reward_scores  # noqa: E402
from sharpgrpo.strategies.thr_kernels import use_fused  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--G", type=int, default=8, help="completions per group")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512], help="completion lengths L")
    parser.add_argument("--vocab", type=int, default=16384, help="vocabulary size V")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size H")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype of hidden states and W")
    parser.add_argument("--matmul-dtype", default="float32", choices=["float32", "tf32", "bfloat16"],
                        help="products: fp32, TF32 (CUDA) or bf16 inputs; accumulation is always fp32")
    parser.add_argument("--methods", nargs="+", default=["fused", "factored", "pairwise"],
                        choices=["fused", "factored", "pairwise", "auto"])
    parser.add_argument("--fused-kernel", default="auto", choices=list(thr_kernels.KERNELS),
                        help="kernel path of the fused method (thr_kernels.KERNELS; auto: "
                             "thr_kernels.AUTO_TRITON_PATH on CUDA when triton is installed)")
    parser.add_argument("--vocab-mode", default="full", choices=["full", "sampled"])
    parser.add_argument("--frac-positive", type=float, default=0.5, help="fraction of the G completions in P")
    parser.add_argument("--chunk-size", type=int, default=1024, help="thr_chunk_size (tokens)")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats per shape (the minimum is reported)")
    parser.add_argument("--rate-size", type=int, default=None,
                        help="side of the square matmul whose rate is measured (default 2048 on CPU, 8192 on CUDA)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    return parser.parse_args(argv)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_large_frees_to_os():
    """glibc only: serve every allocation above 1 MiB with mmap (fixed threshold), so that freed tensors leave the
    resident set and the VmHWM delta measures the call's own peak rather than reusing an earlier call's heap."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _rss_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def measure(fn, device, repeats):
    """(seconds, peak extra bytes or None) of fn(); the time is the minimum over ``repeats`` calls.

    On CPU with one intra-op thread the time is the process CPU time (``time.process_time``): it equals the wall
    time of an unloaded machine and is much less disturbed by other processes sharing the cores; otherwise (CUDA, or
    several CPU threads) it is the wall time, between synchronisations on CUDA."""
    single_thread_cpu = device.type == "cpu" and torch.get_num_threads() == 1
    clock = time.process_time if single_thread_cpu else time.perf_counter
    best = float("inf")
    peak = None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
                before = _rss_kib("VmRSS")
            except OSError:
                before = None
        start = clock()
        result = fn()
        synchronize(device)
        best = min(best, clock() - start)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) - before
        elif before is not None and _rss_kib("VmHWM") is not None:
            peak = (_rss_kib("VmHWM") - before) * 1024
        del result
    return best, peak


def matmul_rate(device, dtype, size):
    """Measured flop/s of a (size x size) @ (size x size) product in ``dtype`` (same clock as :func:`measure`)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds, _ = measure(lambda: a @ b, device, 3)
    return 2 * size**3 / seconds


def method_flops(method, n_tokens, n_pos, vocab, hidden, sub_vocab, path="torch"):
    """Flops of ``method`` (``path``: the fused method's kernel path, resolved)."""
    if method == "fused":  # P-token logsumexp pass, then logits, S tiles and U = H S^T (thr_kernels.py)
        return thr_kernels.path_flops(path, n_tokens, n_pos, hidden, vocab)
    lse_pass = 2 * n_tokens * vocab * hidden
    if method == "factored":
        return lse_pass + 2 * sub_vocab * hidden * (2 * n_tokens + n_pos)
    return lse_pass + 2 * sub_vocab * n_tokens * (hidden + n_pos) + 2 * n_pos * n_tokens * hidden


def fmt_bytes(n):
    return "n/a" if n is None else f"{n / 2**20:.0f} MiB"


def main(argv=None):
    args = parse_args(argv)
    thr_kernels.DEFAULT_KERNEL = args.fused_kernel
    device = torch.device(args.device)
    if device.type == "cpu":
        release_large_frees_to_os()
    dtype = DTYPES[args.dtype]
    matmul_dtype = torch.bfloat16 if args.matmul_dtype == "bfloat16" else None
    if args.matmul_dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    gen = torch.Generator(device="cpu").manual_seed(0)
    weight = (torch.randn(args.vocab, args.hidden, generator=gen) * (2.0 / args.hidden**0.5)).to(device, dtype)
    rate_dtype = torch.bfloat16 if matmul_dtype is not None else torch.float32
    rate = matmul_rate(device, rate_dtype, args.rate_size or (2048 if device.type == "cpu" else 8192))
    print(f"device={device} threads={torch.get_num_threads()} dtype={args.dtype} matmul={args.matmul_dtype} "
          f"G={args.G} V={args.vocab} H={args.hidden} vocab_mode={args.vocab_mode} chunk_size={args.chunk_size} "
          f"frac_positive={args.frac_positive} fused_kernel={args.fused_kernel}; measured matmul rate {rate / 1e9:.1f} GFLOP/s ({rate_dtype})")
    header = ("| L | N | nP | method | THR time | THR peak mem | unembed fwd | THR / unembed | floor GFLOP "
              "| method GFLOP | floor frac | method frac |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    rows = []
    agreement = {}
    for length in args.lengths:
        n_pos_rows = max(1, min(args.G - 1, round(args.frac_positive * args.G)))
        hidden = torch.randn(args.G, length, args.hidden, generator=gen).to(device, dtype)
        ids = torch.randint(0, args.vocab, (args.G, length), generator=gen).to(device)
        mask = torch.ones(args.G, length, dtype=torch.long, device=device)
        positive = torch.zeros(args.G, dtype=torch.bool, device=device)
        positive[:n_pos_rows] = True
        n_tokens, n_pos = args.G * length, n_pos_rows * length
        sub_vocab = args.vocab if args.vocab_mode == "full" else int(torch.unique(ids).numel())
        flat = hidden.reshape(-1, args.hidden)

        def unembed():
            with torch.no_grad():
                return flat @ weight.T

        unembed()  # warm-up
        unembed_time, _ = measure(unembed, device, args.repeats)
        for method in args.methods:
            def scores():
                return token_hidden_reward_scores(hidden, ids, mask, positive, weight, None, 1.0, args.vocab_mode,
                                                  args.chunk_size, method=method, matmul_dtype=matmul_dtype)

            if length == args.lengths[0]:
                scores()  # warm-up
            seconds, peak = measure(scores, device, args.repeats)
            if length == args.lengths[0]:  # agreement of the methods (e.g. the Triton kernel on a GPU)
                result = scores().scores
                if "first" not in agreement:
                    agreement["first"] = (method, result)
                else:
                    base_method, base = agreement["first"]
                    rel = float((result - base).abs().max() / base.abs().max().clamp(min=1e-30))
                    agreement[method] = rel
                    print(f"max |{method} - {base_method}| / max |{base_method}| = {rel:.2e}", flush=True)
            chosen = method
            if method == "auto" and use_fused("auto", args.vocab_mode, n_tokens, n_pos, args.hidden, args.vocab,
                                              args.chunk_size):
                chosen = "fused"
            elif method == "auto":
                f_fact = method_flops("factored", n_tokens, n_pos, args.vocab, args.hidden, sub_vocab)
                f_pair = method_flops("pairwise", n_tokens, n_pos, args.vocab, args.hidden, sub_vocab)
                fits = n_pos * n_tokens <= args.chunk_size * args.vocab
                chosen = "pairwise" if fits and f_pair < f_fact else "factored"
            floor = 2 * n_pos * n_tokens * sub_vocab
            path = thr_kernels.resolve_kernel(args.fused_kernel, device) if chosen == "fused" else None
            flops = method_flops(chosen, n_tokens, n_pos, args.vocab, args.hidden, sub_vocab, path)
            row = {
                "L": length, "N": n_tokens, "nP": n_pos, "method": method if method != "auto" else f"auto={chosen}",
                "thr_s": seconds, "thr_peak_bytes": peak, "unembed_s": unembed_time,
                "floor_gflop": floor / 1e9, "method_gflop": flops / 1e9,
                "floor_frac": floor / seconds / rate, "method_frac": flops / seconds / rate,
                "kernel_path": path, "method_floor_s": flops / rate,  # the method's flops at the matmul rate
            }
            rows.append(row)
            print(f"| {length} | {n_tokens} | {n_pos} | {row['method']} | {seconds:.3f} s | {fmt_bytes(peak)} | "
                  f"{unembed_time:.3f} s | {seconds / unembed_time:.1f}x | {row['floor_gflop']:.1f} | "
                  f"{row['method_gflop']:.1f} | {row['floor_frac']:.2f} | {row['method_frac']:.2f} |", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rate": rate,
                                         "rows": rows}, indent=2))
    return {"rate": rate, "rows": rows, "agreement": {k: v for k, v in agreement.items() if k != "first"}}


if __name__ == "__main__":
    main()
