"""Statistics of sharpgrpo compare against hand-computed values and float64 loop references."""

import math
import random
import statistics

import pytest

from sharpgrpo.compare.stats import (
    curve_auc,
    curve_band,
    eval_accuracy,
    final_mean,
    mean_interval,
    paired_difference,
    run_metrics,
    summarize,
    t_cdf,
    t_quantile,
)

# Two-sided 95% critical values t_{0.975, df} from standard tables.
T_975 = {1: 12.7062047, 2: 4.30265273, 3: 3.18244631, 4: 2.77644511, 5: 2.57058184, 9: 2.26215716, 30: 2.04227246}


@pytest.mark.parametrize("df,expected", sorted(T_975.items()))
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, rel=1e-7)
    assert t_quantile(0.025, df) == pytest.approx(-expected, rel=1e-7)


def test_t_quantile_other_levels_and_cdf():
    assert t_quantile(0.95, 4) == pytest.approx(2.13184679, rel=1e-7)  # one-sided 95%, df 4
    assert t_quantile(0.995, 10) == pytest.approx(3.16927267, rel=1e-7)
    assert t_quantile(0.5, 3) == 0.0
    assert t_cdf(0.0, 7) == pytest.approx(0.5)
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t) / pi.
    for t in (-3.0, -0.4, 0.7, 5.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, rel=1e-10)
    # Large df approaches the normal: Phi(1.959964) = 0.975.
    assert t_cdf(1.959964, 1e6) == pytest.approx(0.975, abs=1e-6)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_mean_interval_hand_computed():
    # values 1, 2, 3, 6: mean 3, sample variance ((4+1+0+9)/3) = 14/3, half width t_{.975,3} sqrt(14/3)/2.
    stats = mean_interval([1.0, 2.0, 3.0, 6.0])
    half = 3.18244631 * math.sqrt(14 / 3) / 2
    assert stats["n"] == 4 and stats["mean"] == pytest.approx(3.0)
    assert stats["std"] == pytest.approx(math.sqrt(14 / 3))
    assert stats["low"] == pytest.approx(3.0 - half, rel=1e-7) and stats["high"] == pytest.approx(3.0 + half, rel=1e-7)
    assert mean_interval([0.5]) == {"n": 1, "mean": 0.5, "std": None, "low": None, "high": None}
    assert mean_interval([None, float("nan")])["n"] == 0
    flat = mean_interval([2.0, 2.0, 2.0])
    assert flat["low"] == flat["high"] == 2.0


def test_paired_difference_hand_computed():
    values = {0: 0.5, 1: 0.7, 2: 0.4, 3: 0.9}
    baseline = {0: 0.4, 1: 0.7, 2: 0.6, 4: 0.1}  # seed 3 has no baseline, seed 4 no strategy run
    result = paired_difference(values, baseline, direction=+1)
    differences = [0.1, 0.0, -0.2]
    mean = sum(differences) / 3
    std = math.sqrt(sum((d - mean) ** 2 for d in differences) / 2)
    assert result["seeds"] == [0, 1, 2] and result["n"] == 3
    assert result["mean"] == pytest.approx(mean)
    assert result["high"] - result["mean"] == pytest.approx(4.30265273 * std / math.sqrt(3), rel=1e-7)
    assert result["wins"] == 1 and result["ties"] == 1
    assert paired_difference(values, baseline, direction=-1)["wins"] == 1  # lower is better: only seed 2


def test_final_mean_and_auc():
    values = [float(v) for v in range(1, 21)]  # 20 steps: last 10% is the last 2
    assert final_mean(values) == pytest.approx(19.5)
    assert final_mean([1.0, 2.0, 4.0]) == 4.0  # ceil(0.3) = 1 value
    assert final_mean([]) is None
    # Trapezoid over steps 1, 2, 4 of 0, 1, 1: area 0.5 + 2 = 2.5 over a span of 3.
    assert curve_auc([1, 2, 4], [0.0, 1.0, 1.0]) == pytest.approx(2.5 / 3)
    rng = random.Random(0)
    steps = sorted(rng.sample(range(1, 200), 30))
    curve = [rng.random() for _ in steps]
    reference = sum((steps[i + 1] - steps[i]) * (curve[i] + curve[i + 1]) / 2 for i in range(29))
    assert curve_auc(steps, curve) == pytest.approx(reference / (steps[-1] - steps[0]))


def _history(rewards, grad_norms, entropies, step_time=0.25):
    history = [
        {"step": i + 1, "reward": r, "grad_norm": g, "entropy": e, "step_time": step_time}
        for i, (r, g, e) in enumerate(zip(rewards, grad_norms, entropies))
    ]
    history.append({"step": len(rewards), "train_runtime": 99.0, "train_loss": 0.0})
    return history


def test_run_metrics_from_a_history():
    rewards = [0.1 * i for i in range(10)]
    grad_norms = [1.0, 1.0, 1.0, 1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 2.0]  # one spike above 3 x median (1.0)
    entropies = [2.0 - 0.1 * i for i in range(10)]
    metrics = run_metrics(_history(rewards, grad_norms, entropies))
    assert metrics["steps"] == 10
    assert metrics["final_reward"] == pytest.approx(0.9)
    assert metrics["reward_auc"] == pytest.approx(0.45)  # a straight line from 0 to 0.9
    assert metrics["grad_norm_mean"] == pytest.approx(2.0)
    assert metrics["grad_norm_cv"] == pytest.approx(statistics.pstdev(grad_norms) / 2.0)
    assert metrics["grad_norm_spikes"] == 1
    assert metrics["final_entropy"] == pytest.approx(1.1)
    assert metrics["entropy_auc"] == pytest.approx(1.55)  # a straight line from 2.0 to 1.1
    assert metrics["seconds_per_step"] == pytest.approx(0.25)
    assert "eval_accuracy" not in metrics
    result = {"summary": {"overall": {"accuracy": 0.5, "pass@k": {"1": 0.4, "4": 0.8}}}}
    assert run_metrics(_history(rewards, grad_norms, entropies), result)["eval_pass@4"] == 0.8
    assert eval_accuracy({"summary": {"a": {"accuracy": 0.2}, "b": {"accuracy": 0.6}}}) == {
        "eval_accuracy": pytest.approx(0.4)
    }


def test_summarize_and_band():
    per_run = {
        "equal": {0: {"final_reward": 0.5, "grad_norm_mean": 2.0}, 1: {"final_reward": 0.7, "grad_norm_mean": 3.0}},
        "grpo_sg": {0: {"final_reward": 0.6, "grad_norm_mean": 1.0}, 1: {"final_reward": 0.6, "grad_norm_mean": 4.0}},
    }
    summary = summarize(per_run, "equal")
    assert summary["metrics"] == ["final_reward", "grad_norm_mean"]
    assert summary["strategies"]["equal"]["metrics"]["final_reward"]["mean"] == pytest.approx(0.6)
    difference = summary["differences"]["grpo_sg"]
    assert list(summary["differences"]) == ["grpo_sg"]
    assert difference["final_reward"]["mean"] == pytest.approx(0.0) and difference["final_reward"]["wins"] == 1
    assert difference["grad_norm_mean"]["wins"] == 1  # lower grad norm wins on seed 0 only
    steps, means, _lows, highs = curve_band([([1, 2, 3], [0.0, 1.0, 2.0]), ([2, 3], [3.0, 4.0])])
    assert steps == [2, 3] and means == [2.0, 3.0]
    assert highs[0] - means[0] == pytest.approx(12.7062047 * math.sqrt(2.0) / math.sqrt(2), rel=1e-7)


def test_plotted_band_stays_within_the_runs_range():
    """Two seeds of a reward in [0, 1]: the t interval (12.7 standard errors at 95%) leaves [0, 1]; the plotted band
    is clipped to the range the runs took, and the plot shows the runs instead of a band below 3 seeds."""
    from sharpgrpo.compare.report import MIN_RUNS_FOR_BAND, clipped_band
    from sharpgrpo.compare.stats import curve_band

    series = [([1, 2, 3], [0.0, 0.5, 1.0]), ([1, 2, 3], [1.0, 0.0, 0.25])]
    _, _, raw_lows, raw_highs = curve_band(series, 0.95)
    assert min(raw_lows) < 0 and max(raw_highs) > 1  # the unclipped band claims rewards never reached
    steps, means, lows, highs = clipped_band(series, 0.95)
    assert steps == [1, 2, 3] and means == pytest.approx([0.5, 0.25, 0.625])
    assert all(0.0 <= low <= mean <= high <= 1.0 for low, mean, high in zip(lows, means, highs, strict=True))
    assert lows[0] == 0.0 and highs[0] == 1.0 and MIN_RUNS_FOR_BAND > len(series)


def test_table_intervals_are_clipped_to_the_quantity_range(tmp_path):
    """Two seeds: the raw 95% t intervals leave the quantity's range (a reward above the logged maximum, negative
    spikes and seconds); the table's intervals are clipped to it, the clipped ends marked, and the report says so."""
    from sharpgrpo.compare.report import report_markdown
    from sharpgrpo.compare.stats import clip_interval, metric_range, reward_range

    histories = [[{"step": 1, "reward": 0.2}, {"step": 2, "reward": 1.0}], [{"step": 1, "reward": 0.0},
                                                                            {"step": 2, "reward": 0.9}]]  # fmt: skip
    ranges = reward_range(histories)
    assert ranges == {"final_reward": (0.0, 1.0), "reward_auc": (0.0, 1.0)}
    per_run = {
        "equal": {0: {"final_reward": 1.0, "grad_norm_spikes": 0, "seconds_per_step": 0.1},
                  1: {"final_reward": 0.9, "grad_norm_spikes": 1, "seconds_per_step": 0.3}},
        "thr": {0: {"final_reward": 0.2, "grad_norm_spikes": 2, "seconds_per_step": 0.2},
                1: {"final_reward": 0.0, "grad_norm_spikes": 0, "seconds_per_step": 0.2}},
    }  # fmt: skip
    summary = summarize(per_run, "equal", ranges=ranges)
    for label, runs in per_run.items():
        for name in ("final_reward", "grad_norm_spikes", "seconds_per_step"):
            raw = mean_interval([m[name] for m in runs.values()])
            shown = summary["strategies"][label]["metrics"][name]
            low, high = metric_range(name, ranges)
            assert shown["mean"] == pytest.approx(raw["mean"])
            assert shown["low"] == pytest.approx(raw["low"] if low is None else max(raw["low"], low))
            assert shown["high"] == pytest.approx(raw["high"] if high is None else min(raw["high"], high))
            assert ("low" in shown["clipped"]) == (low is not None and raw["low"] < low)
            assert ("high" in shown["clipped"]) == (high is not None and raw["high"] > high)
    equal = summary["strategies"]["equal"]["metrics"]
    assert equal["final_reward"]["high"] == 1.0 and equal["final_reward"]["clipped"] == ["high"]
    assert equal["grad_norm_spikes"]["low"] == 0.0 and equal["seconds_per_step"]["low"] == 0.0
    difference = summary["differences"]["thr"]["final_reward"]
    assert difference["low"] == -1.0 and difference["clipped"] == ["low"]  # a reward difference lies in [-1, 1]
    assert clip_interval({"low": None, "high": None}, 0.0, 1.0)["clipped"] == []
    summary["spike_factor"], summary["ranges"] = 3.0, {k: list(v) for k, v in ranges.items()}
    report = report_markdown(summary, [], "sharpgrpo compare ...")
    assert "| equal | 2 | 0.95 [0.3147, 1*] |" in report
    assert "Intervals are clipped to the quantity's range, a clipped end marked `*`: rewards to [0, 1]" in report
    assert "With 2 seeds a Student-t interval is wide" in report
