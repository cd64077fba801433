"""Launch configurations of the THR Triton kernel (sharpgrpo/strategies/_thr_triton.py) on a GPU, then the whole score.

For each candidate (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) it

* checks the tile statistics of one vocabulary tile (bf16 inputs, fp32 accumulation) against float64 on the same
  bf16 values: the quantities the score is built from (log-normaliser, 1 - q(y), the weighted sum over other ids,
  own u), as the largest relative error;
* times the kernel on the tile the fused score runs at the issue's shape (N = G * L tokens against one vocabulary
  tile of ``thr_chunk_size * V / N`` columns, with ``U`` and without it, the pass-1 form) and prints its TFLOP/s.

Then it checks the whole fused score with the kernel against the float64 reference of the test suite (small shapes,
fp32, on the GPU), sets the fastest configuration and runs ``thr_bench.py`` with the given arguments for the Triton
and the torch kernels. ``--skip-tune``: the module's configurations as they are. Needs CUDA and triton.

    python benchmarks/thr_triton_tune.py --json tune.json -- --device cuda --dtype bfloat16 --vocab 151936 \\
        --hidden 1536 --lengths 1024 2048 4096 --matmul-dtype bfloat16 --methods fused factored --repeats 3

The sweep times the second kernel's two launches too (the P rows' D tile, ``triton_error_tile``, and their token
side from D, ``triton_error_u``, on nP = N / 2 rows) and sets ``TRITON_ERROR_CONFIG`` / ``TRITON_ERROR_U_CONFIG`` to
the fastest; ``--kernels`` names the thr_bench.py runs (kernel paths, ``thr_kernels.KERNELS``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "strategies"))

from sharpgrpo.strategies import thr_kernels  # noqa: E402

DTYPE = torch.bfloat16  # --dtype float32 for a dry run in Triton's CPU interpreter (it mishandles bf16 dots)

CANDIDATES = [  # (block_m, block_n, block_k, num_warps, num_stages)
    (64, 64, 64, 4, 3),
    (64, 128, 64, 4, 3),
    (128, 64, 64, 4, 3),
    (128, 64, 64, 8, 3),
    (128, 64, 32, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 2),
    (128, 128, 32, 8, 4),
    (256, 64, 64, 8, 3),
    (64, 256, 64, 8, 3),
    (64, 256, 64, 4, 3),
    (64, 256, 32, 8, 4),
    (128, 256, 64, 8, 3),
]


def time_cuda(fn, repeats):
    """Median seconds of ``fn()`` over ``repeats`` calls, by CUDA events, after one warm-up call."""
    fn()
    if not torch.cuda.is_available():  # dry run of the script in Triton's CPU interpreter
        import time

        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return sorted(times)[len(times) // 2]


def derived(stats):
    """The quantities the score uses, from (6, N) statistics: lse, 1 - q(y), numerator / total, own u."""
    stats = stats.double()
    total = stats[1] + stats[2]
    return {"lse": stats[0] + total.log(), "1-q": stats[1] / total, "num/total": stats[3] / total, "own_u": stats[4]}


def random_tile(n, cols, hidden, id_range, device, seed):
    """Hidden states (n, H), one vocabulary tile of W and of S (cols, H) and token ids in [0, id_range) (ids past the
    tile belong to other tiles)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    h = torch.randn(n, hidden, generator=gen).to(device, DTYPE)
    w = (torch.randn(cols, hidden, generator=gen) * 2 / hidden**0.5).to(device, DTYPE)
    s = (torch.randn(cols, hidden, generator=gen) * 1e-3).to(device, DTYPE)
    ids = torch.randint(0, id_range, (n,), generator=gen).to(device, torch.int32)
    return h, w, s, ids


def tile_error(config, n, cols, hidden, device):
    h, w, s, ids = random_tile(n, cols, hidden, cols, device, seed=0)
    stats = thr_kernels.triton_tile_statistics(h, w, s, None, ids, 1.0, **config)
    z = h.double() @ w.double().T
    u = h.double() @ s.double().T
    top = z.max(dim=1).values
    e = torch.exp(z - top[:, None])
    own = torch.arange(cols, device=device)[None, :] == ids.long()[:, None]
    expected = torch.stack([top, (e * ~own).sum(1), (e * own).sum(1), (e * u * ~own).sum(1), (u * own).sum(1),
                            (e * z).sum(1)])
    got, want = derived(stats), derived(expected)
    return max(float((got[k] - want[k]).abs().max() / want[k].abs().max()) for k in want)


def reference_error(device, kernel: str, seeds=(40, 41, 42)) -> float:
    """Largest relative error (to the largest score) of the fused score through kernel path ``kernel`` on
    ``device`` against the test suite's float64 loop reference (tests/strategies/test_thr.py), fp32, on small random
    groups with ragged lengths; entropies and per-completion sums are checked too (relative to their largest)."""
    from test_thr import make_group, reference_scores

    from sharpgrpo.strategies.thr import token_hidden_reward_scores

    worst = 0.0
    for seed in seeds:
        hidden, tok, mask, positive, weight, bias = make_group(seed, G=4, T=9)
        saved, thr_kernels.DEFAULT_KERNEL = thr_kernels.DEFAULT_KERNEL, kernel
        try:
            result = token_hidden_reward_scores(hidden.to(device), tok.to(device), mask.to(device),
                                                positive.to(device), weight.to(device), bias.to(device), 0.9, "full",
                                                8, compute_entropy=True, method="fused", beta=1.1)
        finally:
            thr_kernels.DEFAULT_KERNEL = saved
        scores, _, influence, entropy = reference_scores(hidden, tok, mask, positive, weight, bias, 0.9, beta=1.1)
        pairs = ((result.scores, scores * mask), (result.entropies, entropy * mask),
                 (result.sequence_influence[positive.to(device)], influence[positive]))
        for got, want in pairs:
            worst = max(worst, float((got.cpu().double() - want).abs().max() / want.abs().max()))
    return worst


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    bench_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--skip-tune", action="store_true", help="no candidate sweep: check and bench as configured")
    parser.add_argument("--kernels", nargs="+", default=["triton", "triton-tokens", "torch"],
                        choices=list(thr_kernels.KERNELS), help="thr_bench.py runs, one per kernel path")
    args = parser.parse_args(argv)
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: TRITON_INTERPRET=1 dry run
    n = args.G * args.length
    from sharpgrpo.strategies.thr_vocab import slice_width

    cols = slice_width(args.chunk_size, args.vocab, n)  # the width of the fused score's vocabulary tiles
    h, w, s, ids = random_tile(n, cols, args.hidden, args.vocab, device, seed=1)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{name}; tile: N={n} x {cols} columns, H={args.hidden}, {args.dtype}", flush=True)
    print("| BM | BN | BK | warps | stages | max rel err (tile stats) | with U | TFLOP/s | without U | TFLOP/s "
          "| D tile (nP rows) | TFLOP/s | U from D (nP rows) | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    n_pos = n // 2
    lse, one_minus_q = torch.zeros(n_pos, device=device), torch.ones(n_pos, device=device)
    rows = []
    for bm, bn, bk, warps, stages in [] if args.skip_tune else CANDIDATES:
        config = {"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": stages}
        try:
            error = tile_error(config, 2048, 1000, args.hidden, device)
            with_u = time_cuda(lambda: thr_kernels.triton_tile_statistics(h, w, s, None, ids, 1.0, **config),
                               args.repeats)
            without_u = time_cuda(lambda: thr_kernels.triton_tile_statistics(h, w, None, None, ids, 1.0, **config),
                                  args.repeats)
            d_pos = thr_kernels.triton_error_tile(h[:n_pos], w, None, ids[:n_pos], lse, one_minus_q, 1.0, **config)
            d_time = time_cuda(lambda: thr_kernels.triton_error_tile(h[:n_pos], w, None, ids[:n_pos], lse,
                                                                     one_minus_q, 1.0, **config), args.repeats)
            du_time = time_cuda(lambda: thr_kernels.triton_error_u(h[:n_pos], s, d_pos, ids[:n_pos], **config),
                                args.repeats)
        except Exception as failure:  # noqa: BLE001 - a configuration that does not compile (registers, smem)
            print(f"| {bm} | {bn} | {bk} | {warps} | {stages} | failed: {type(failure).__name__}: "
                  f"{str(failure).splitlines()[0][:80]} |||||", flush=True)
            continue
        flops_u, flops = 4 * n * cols * args.hidden, 2 * n * cols * args.hidden
        pos_flops = 2 * n_pos * cols * args.hidden
        rows.append({**config, "rel_err": error, "with_u_s": with_u, "without_u_s": without_u,
                     "with_u_tflops": flops_u / with_u / 1e12, "without_u_tflops": flops / without_u / 1e12,
                     "d_tile_s": d_time, "u_from_d_s": du_time})
        print(f"| {bm} | {bn} | {bk} | {warps} | {stages} | {error:.1e} | {with_u * 1e3:.2f} ms | "
              f"{flops_u / with_u / 1e12:.0f} | {without_u * 1e3:.2f} ms | {flops / without_u / 1e12:.0f} | "
              f"{d_time * 1e3:.2f} ms | {pos_flops / d_time / 1e12:.0f} | {du_time * 1e3:.2f} ms | "
              f"{pos_flops / du_time / 1e12:.0f} |", flush=True)
    if rows:  # the fastest accurate candidates become the configurations used below (--skip-tune: as configured)
        accurate = [r for r in rows if r["rel_err"] < 1e-3]
        for config, key in ((thr_kernels.TRITON_TILE_CONFIG, "with_u_s"),
                            (thr_kernels.TRITON_NORMALISER_CONFIG, "without_u_s"),
                            (thr_kernels.TRITON_ERROR_CONFIG, "d_tile_s"),
                            (thr_kernels.TRITON_ERROR_U_CONFIG, "u_from_d_s")):
            fastest = min(accurate, key=lambda r: r[key])
            config.update({k: fastest[k] for k in config})
    print(f"kernel configurations (the fastest accurate candidates unless --skip-tune): with U "
          f"{thr_kernels.TRITON_TILE_CONFIG}, without U {thr_kernels.TRITON_NORMALISER_CONFIG}, D tile "
          f"{thr_kernels.TRITON_ERROR_CONFIG}, U from D {thr_kernels.TRITON_ERROR_U_CONFIG}", flush=True)

    # The whole fused score with each Triton path, against the suite's float64 reference (fp32, on the GPU).
    errors = {path: reference_error(device, path) for path in ("triton-tokens", "triton")}
    for path, error in errors.items():
        print(f"fused score with the {path} kernel path on {device} vs float64 reference (fp32, 3 groups): "
              f"max rel error {error:.1e}", flush=True)
    if args.json is not None:
        device_name = str(device) if device.type == "cpu" else torch.cuda.get_device_name()
        args.json.write_text(json.dumps({"device": device_name, "tile_columns": cols, "rows": rows,
                                         "best": thr_kernels.TRITON_TILE_CONFIG,
                                         "best_normaliser": thr_kernels.TRITON_NORMALISER_CONFIG,
                                         "best_error": thr_kernels.TRITON_ERROR_CONFIG,
                                         "best_error_u": thr_kernels.TRITON_ERROR_U_CONFIG,
                                         "reference_rel_err": errors}, indent=2))
    if bench_argv:
        import thr_bench

        for kernel in args.kernels:
            print(f"\nthr_bench.py {' '.join(bench_argv)} --fused-kernel {kernel}", flush=True)
            thr_bench.main([*bench_argv, "--fused-kernel", kernel])


if __name__ == "__main__":
    main()
