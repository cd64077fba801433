"""Accuracy estimators of the evaluation tables: avg@k and the unbiased pass@k.

n samples are drawn per problem and c of them are correct. The papers report avg@16 (mean accuracy over the 16
samples) and pass@16 for AMC and AIME (GRPO-SG Sec. 4.1, docs/methods.md §5).
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Codex, Eq. 1).

    Evaluated as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the binomial coefficients, so it
    stays exact in floating point for any n. It is the probability that k samples drawn without replacement from the
    n contain at least one of the c correct ones.
    """
    if not 0 <= c <= n:
        raise ValueError(f"Need 0 <= c <= n, got n={n}, c={c}.")
    if not 1 <= k <= n:
        raise ValueError(f"Need 1 <= k <= n, got n={n}, k={k}.")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def avg_at_k(n: int, c: int) -> float:
    """avg@n of one problem: the share of its n samples that are correct."""
    if not 0 <= c <= n or n < 1:
        raise ValueError(f"Need 0 <= c <= n and n >= 1, got n={n}, c={c}.")
    return c / n


def pass_k_values(n: int) -> list[int]:
    """The k reported for n samples: the powers of two up to n, and n itself (pass@n) when n is not one."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    ks = []
    k = 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k of a data set: the mean over problems of :func:`pass_at_k`, from ``(n, c)`` per problem."""
    if not counts:
        raise ValueError("No problems to average over.")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def mean_avg_at_k(counts: Sequence[tuple[int, int]]) -> float:
    """avg@n of a data set: the mean over problems of c/n (with n = 1 this is greedy accuracy)."""
    if not counts:
        raise ValueError("No problems to average over.")
    return sum(avg_at_k(n, c) for n, c in counts) / len(counts)
