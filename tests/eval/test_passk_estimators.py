"""pass@k and avg@k against brute-force enumeration and the binomial formula."""

from __future__ import annotations

import itertools
import math

import pytest

from sharpgrpo.evaluation.metrics import (
    avg_at_k,
    mean_avg_at_k,
    mean_pass_at_k,
    pass_at_k,
    pass_k_values,
)


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (c of them correct) that contain a correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_binomial_formula_and_stays_stable_for_large_n():
    for n, c, k in [(16, 3, 4), (64, 5, 16), (200, 1, 100), (1000, 7, 500)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # exact integers, then one division
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    # C(5000, 2500) overflows a float; the product form does not need it.
    value = pass_at_k(5000, 3, 2500)
    assert 0.0 < value < 1.0 and value == pytest.approx(1 - 0.5**3, abs=1e-3)


def test_pass_at_k_special_cases():
    assert pass_at_k(16, 0, 16) == 0.0
    assert pass_at_k(16, 1, 16) == 1.0
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)
    assert pass_at_k(4, 2, 3) == 1.0  # n - c < k: every 3-subset holds a correct one


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_invalid_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_k_values_are_powers_of_two_up_to_n():
    assert pass_k_values(1) == [1]
    assert pass_k_values(16) == [1, 2, 4, 8, 16]
    assert pass_k_values(12) == [1, 2, 4, 8, 12]  # pass@n is always reported
    with pytest.raises(ValueError):
        pass_k_values(0)


def test_dataset_means():
    counts = [(4, 0), (4, 1), (4, 4)]
    assert mean_avg_at_k(counts) == pytest.approx((0 + 0.25 + 1) / 3)
    assert avg_at_k(4, 1) == 0.25
    assert mean_pass_at_k(counts, 1) == pytest.approx(mean_avg_at_k(counts))  # pass@1 is avg@n
    assert mean_pass_at_k(counts, 4) == pytest.approx(2 / 3)
    assert mean_pass_at_k(counts, 2) == pytest.approx((0 + 0.5 + 1) / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)
