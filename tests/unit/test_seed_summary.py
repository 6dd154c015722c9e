"""The seed report's mean over seeds: a seed is one sample of the recipe however many runs it has."""

from __future__ import annotations

import statistics

from agent_trainer.outer_loop.report import seed_report


def row(seed: int, gain: float, run: str) -> dict:
    empty = dict.fromkeys([*seed_report.CSV_COLUMNS, "heldout_start_lo"])
    return {**empty, "seed": seed, "run": run, "run_id": run, "reward_gain": gain, "reward_gain_lo": gain - 0.05,
            "reward_gain_hi": gain + 0.05, "paired_train_gain": gain, "paired_train_gain_lo": gain - 0.01}


def test_a_seed_run_twice_counts_once_in_the_mean_and_its_interval():
    once = [row(0, 0.10, "a"), row(1, 0.11, "b"), row(2, 0.07, "c")]
    twice = once + [row(0, 0.10, "a2"), row(1, 0.11, "b2")]   # seeds 0 and 1 trained again, the same numbers
    s1, s2 = seed_report.summary_row(once), seed_report.summary_row(twice)
    assert (s2["seeds"], s2["runs"]) == (3, 5)
    for key in ("reward_gain_mean", "reward_gain_sd", "reward_gain_mean_lo", "reward_gain_mean_hi",
                "paired_train_gain_mean_lo", "gain_above_0", "paired_train_gain_known"):
        assert s2[key] == s1[key], key
    md = seed_report.markdown([("", twice, s2)])
    assert "mean ± sd (3 seeds)" in md and "5 runs of 3 seeds" in md


def test_a_seeds_runs_that_differ_are_averaged():
    s = seed_report.summary_row([row(0, 0.10, "a"), row(0, 0.20, "a2"), row(1, 0.05, "b")])
    assert s["seeds"] == 2
    assert abs(s["reward_gain_mean"] - statistics.fmean([0.15, 0.05])) < 1e-12
