"""Held-out evaluation without a model: the bootstrap intervals, the schedule, the rows' summary and
MLflow points, and the plot's points."""

from __future__ import annotations

import numpy as np
import pytest

from agent_trainer.outer_loop.rl import heldout
from agent_trainer.outer_loop.report.bootstrap import episodes_for, mean_ci, paired_diff_ci


def test_mean_ci_contains_the_true_mean_and_is_reproducible():
    rng = np.random.default_rng(0)   # a sample whose mean is 0.303
    x = rng.normal(0.3, 0.2, size=200)
    mean, lo, hi = mean_ci(x)
    assert lo < 0.3 < hi and lo < mean < hi
    assert hi - lo == pytest.approx(2 * 1.96 * 0.2 / np.sqrt(200), rel=0.2)   # the normal approximation's width
    assert mean_ci(x) == (mean, lo, hi), "same values, same seed: same interval"
    assert mean_ci([0.4]) == (0.4, 0.4, 0.4)
    with pytest.raises(ValueError):
        mean_ci([])


def test_mean_ci_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(11)
    hits = sum(lo < 0.5 < hi for _, lo, hi in (mean_ci(rng.normal(0.5, 0.3, size=60), resamples=500, seed=i)
                                               for i in range(200)))
    assert 0.88 <= hits / 200 <= 0.99


def test_paired_ci_excludes_zero_for_a_clear_shift_and_includes_it_for_none():
    rng = np.random.default_rng(3)
    before = rng.uniform(0.0, 0.7, size=64)              # episodes differ a lot from one another...
    shifted = before + 0.05 + rng.normal(0, 0.03, 64)    # ...but each gains about 0.05
    gain, lo, hi = paired_diff_ci(before, shifted)
    assert 0 < lo < 0.05 < hi and gain == pytest.approx(0.05, abs=0.01)
    # each evaluation's own interval is wide (the episodes differ): they overlap, the paired one does not
    assert mean_ci(before)[2] > mean_ci(shifted)[1], "pairing is what makes 0.05 visible here"
    same = before + rng.normal(0, 0.03, 64)
    _, lo0, hi0 = paired_diff_ci(before, same)
    assert lo0 < 0 < hi0
    with pytest.raises(ValueError, match="same episodes"):
        paired_diff_ci([0.1, 0.2], [0.3])


def test_episodes_for_a_paired_change():
    assert episodes_for(sd_diff=0.2, change=0.05) == 62      # (1.96 x 0.2 / 0.05)^2 = 61.5
    assert episodes_for(sd_diff=0.0, change=0.05) == 2


@pytest.mark.parametrize("steps, every, at_start, before, after", [
    (13, 5, True, [0, 5, 10], [12]),
    (13, 5, False, [5, 10], [12]),
    (13, 4, True, [0, 4, 8], [12]),      # step 12's periodic evaluation: the end follows it one update later
    (1, 5, True, [0], [0]),
    (3, 0, True, [], []),                 # heldout_every 0: none at all
])
def test_schedule(steps, every, at_start, before, after):
    got = [heldout.schedule(s, steps, every, at_start) for s in range(steps)]
    assert [s for s, (b, _) in enumerate(got) if b] == before
    assert [s for s, (_, a) in enumerate(got) if a] == after
    assert not any(any(x) for x in (heldout.schedule(s, steps, every, at_start, enabled=False) for s in range(steps)))


def _rows():
    start = [0.0, 0.35, 0.35, 0.0, 0.5, 0.35]
    end = [0.35, 0.35, 0.5, 0.35, 0.5, 0.5]
    rows = [{"step": 0, "reward_mean": 0.3, **_held("heldout_", start)}]
    rows += [{"step": s, "reward_mean": 0.3 + 0.05 * s} for s in (1, 2)]
    rows += [{"step": 3, "reward_mean": 0.5, **_held("heldout_end_", end), **heldout.gain_metrics(start, end)}]
    return rows, start, end


def _held(prefix: str, rewards: list[float]) -> dict:
    return {f"{prefix}reward_mean": float(np.mean(rewards)), **heldout.interval_metrics(rewards, prefix)}


def test_summary_start_end_and_paired_gain():
    rows, start, end = _rows()
    s = heldout.summary(rows)
    assert s["heldout_start"] == pytest.approx(np.mean(start)) and s["heldout_end"] == pytest.approx(np.mean(end))
    assert s["heldout_gain"] == pytest.approx(np.mean(end) - np.mean(start))
    assert s["heldout_gain_ci"] == [rows[-1]["heldout_gain_lo"], rows[-1]["heldout_gain_hi"]]
    lo, hi = s["heldout_gain_ci"]
    assert lo <= s["heldout_gain"] <= hi and s["heldout_episodes"] == 6
    lo, hi = s["heldout_start_ci"]
    assert lo <= s["heldout_start"] <= hi
    # other episodes at the end (heldout_episodes changed on a resume): no paired gain
    assert heldout.gain_metrics(start, end[:4]) == {}
    # no end evaluation (stopped early): the last periodic one instead
    rows2 = [rows[0], {"step": 1, "reward_mean": 0.3, **_held("heldout_", end)}]
    s2 = heldout.summary(rows2)
    assert "heldout_end" not in s2 and "heldout_gain" not in s2 and s2["heldout_last_step"] == 1
    assert heldout.summary([{"step": 0, "reward_mean": 0.3}]) == {}


def test_summarize_puts_held_out_next_to_the_training_gain():
    from agent_trainer.outer_loop.rl.metrics import summarize

    rows, *_ = _rows()
    keys = list(summarize(rows))
    i = keys.index("reward_gain")
    assert keys[i + 1:i + 7] == ["heldout_start", "heldout_start_ci", "heldout_end", "heldout_end_ci", "heldout_gain",
                                 "heldout_gain_ci"]


def test_points_log_the_end_one_step_later_under_the_same_names():
    rows, *_ = _rows()
    (s0, own0), = heldout.points(rows[0])
    assert s0 == 0 and "heldout_reward_mean" in own0 and "heldout_rewards" not in own0
    (s3, own3), (s4, end) = heldout.points(rows[-1])
    assert (s3, s4) == (3, 4) and "heldout_gain" in own3 and not any(k.startswith("heldout_end_") for k in own3)
    assert end["heldout_reward_mean"] == rows[-1]["heldout_end_reward_mean"]
    assert set(end) == {"heldout_reward_mean", "heldout_reward_lo", "heldout_reward_hi"}


def test_plot_points_and_file(tmp_path):
    from agent_trainer.outer_loop.report.plots import heldout_points, write_training_plots

    rows, *_ = _rows()
    pts = heldout_points(rows)
    assert [p[0] for p in pts] == [0, 4]
    assert all(lo <= y <= hi for _, y, lo, hi in pts)
    # an older run's rows (no interval): points without bars
    assert heldout_points([{"step": 4, "reward_mean": 0.2, "heldout_reward_mean": 0.1}]) == [(4, 0.1, None, None)]
    paths = write_training_plots(rows, tmp_path)
    assert (tmp_path / "heldout.png").read_bytes()[:4] == b"\x89PNG" and len(paths) == 3


def _train_rows():
    start, end = [0.1, 0.3, 0.0, 0.5], [0.2, 0.3, 0.4, 0.5]
    rows = [{"step": 0, "reward_mean": 0.3, **_held("train_eval_", start)}, {"step": 1, "reward_mean": 0.4}]
    last = {"step": 2, "reward_mean": 0.5, **_held("train_eval_end_", end)}
    rows.append({**last, **heldout.paired_train(rows[0], last, episodes=2)})
    return rows, start, end


def test_training_families_start_end_and_paired_gain():
    """outer.train_eval_episodes: the last row holds the paired gain under policy_eval's names, the summary and the
    MLflow points show start and end as one curve (the end one step later)."""
    rows, start, end = _train_rows()
    last = rows[-1]
    assert last["paired_train_start"] == pytest.approx(np.mean(start))
    assert last["paired_train_end"] == pytest.approx(np.mean(end))
    assert last["paired_train_gain"] == pytest.approx(np.mean(end) - np.mean(start))
    assert last["paired_train_gain_lo"] <= last["paired_train_gain"] <= last["paired_train_gain_hi"]
    assert last["paired_train_episodes"] == 2.0
    s = heldout.train_summary(rows)
    assert s["paired_train_gain_ci"] == [last["paired_train_gain_lo"], last["paired_train_gain_hi"]]
    assert s["paired_train_start"] == last["paired_train_start"] and s["paired_train_episodes"] == 2.0
    # a run stopped before its end: the start alone; other episodes at the end (changed on a resume): no gain
    assert heldout.train_summary(rows[:2]) == {"paired_train_start": pytest.approx(np.mean(start))}
    assert heldout.paired_train(rows[0], {**last, "train_eval_end_rewards": end[:2]}, episodes=1) == {}
    assert heldout.train_summary([{"step": 0, "reward_mean": 0.3}]) == {}
    (s2, own), (s3, ended) = heldout.points(last)
    assert (s2, s3) == (2, 3) and "paired_train_gain" in own and not any(k.startswith("train_eval_end") for k in own)
    assert set(ended) == {"train_eval_reward_mean", "train_eval_reward_lo", "train_eval_reward_hi"}


def test_plot_draws_the_training_families_beside_the_held_out_ones(tmp_path, monkeypatch):
    import agent_trainer.outer_loop.report.plots as plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(
        (fig.axes[0].get_title(), [t.get_text() for t in fig.axes[0].get_legend().get_texts()])))
    train, _, _ = _train_rows()
    held, _, _ = _rows()
    plots.heldout_plot(train, tmp_path / "a.png")
    plots.heldout_plot([{**h, **t} for h, t in zip(held, train)] + held[len(train):], tmp_path / "b.png")
    plots.heldout_plot(held, tmp_path / "c.png")
    assert drawn[0] == ("Training families on fixed seeds",
                        ["training families", "training families, fixed seeds (4 episodes, 95% CI)"])
    assert drawn[1][0] == "Held-out families and training families on fixed seeds" and len(drawn[1][1]) == 3
    assert drawn[2] == ("Held-out families", ["training families", "held-out families (6 episodes, 95% CI)"])


def test_unpaired_ci_excludes_zero_for_a_clear_shift_and_includes_it_for_none():
    from agent_trainer.outer_loop.report.bootstrap import diff_ci

    before = [0.1, 0.3, 0.2, 0.25, 0.15, 0.2, 0.3, 0.1]
    gain, lo, hi = diff_ci(before, [x + 0.3 for x in reversed(before)])
    assert gain == pytest.approx(0.3) and 0 < lo < 0.3 < hi
    _, lo0, hi0 = diff_ci(before, list(reversed(before)))
    assert lo0 < 0 < hi0
    assert diff_ci(before, before) == diff_ci(before, before), "reproducible"
    with pytest.raises(ValueError):
        diff_ci([], [0.3])


def test_training_gain_reads_the_episodes_of_the_first_and_last_steps(tmp_path):
    """The interval is over the first and last 3 steps' training episodes; held-out and excluded ones are left out."""
    import json

    from agent_trainer.outer_loop.report.bootstrap import diff_ci
    from agent_trainer.outer_loop.rl.metrics import training_gain

    def episode(name, total, excluded=False):
        (tmp_path / "episodes" / name).mkdir(parents=True)
        (tmp_path / "episodes" / name / "summary.json").write_text(
            json.dumps({"reward": {"total": total, "excluded": excluded}}))

    first, last = [0.1, 0.2, 0.15, 0.05, 0.2, 0.1], [0.5, 0.4, 0.6, 0.45, 0.55, 0.5]
    per_step = {0: first[0:2], 1: first[2:4], 2: first[4:6], 3: [0.9, 0.9],   # step 3 is in neither side
                4: last[0:2], 5: last[2:4], 6: last[4:6]}
    for step, values in per_step.items():
        for i, v in enumerate(values):
            episode(f"s{step:04d}-train-calc_chain_v1_tiny-{i}", v)
    episode("s0000-heldout-triage_v1_tiny-0", 1.0)
    episode("s0006-train-sort_numbers_v1_tiny-9", 0.0, excluded=True)
    got = training_gain(tmp_path, steps=7)
    _, lo, hi = diff_ci(first, last)
    assert got == {"reward_gain_lo": lo, "reward_gain_hi": hi} and lo > 0
    assert training_gain(tmp_path, steps=5) == {}, "under 2 x 3 steps the sides would overlap"


def test_the_plan_names_every_fixed_seed_evaluation():
    """at-train dry_run=true: which evaluations a run will play, how big, and when."""
    from agent_trainer.outer_loop.rl.run_config import evaluations
    from agent_trainer.config import OuterConfig
    from agent_trainer.outer_loop.rl.train import TrainSettings

    both = TrainSettings(OuterConfig(steps=6, heldout_every=2, heldout_episodes=4, train_eval_episodes=3),
                         heldout_tasks=["a"], train_tasks=["x", "y"])
    assert evaluations(both) == "held-out 1 task x 4 (start, step 2, step 4, end); training 2 tasks x 3 (start, end)"
    late = TrainSettings(OuterConfig(steps=6, heldout_every=2, heldout_episodes=4, heldout_at_start=False),
                         heldout_tasks=["a", "b"], train_tasks=["x"])
    assert evaluations(late) == "held-out 2 tasks x 4 (step 2, step 4, end)"
    assert evaluations(TrainSettings(OuterConfig(steps=6, heldout_every=0), heldout_tasks=["a"],
                                     train_tasks=["x"])) == "none"
