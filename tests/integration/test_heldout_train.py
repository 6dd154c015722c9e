"""Held-out evaluation inside at-train (smoke experiment, 2 steps): a start and an end evaluation on the
same episode seeds, their intervals and the paired gain in metrics.jsonl, MLflow and the summary; and
the training numbers are those of the same run without held-out evaluation."""

from __future__ import annotations

import json

import pytest

from agent_trainer.config import compose_config
from agent_trainer.tracking import read_metrics

pytestmark = pytest.mark.slow

# Keys that differ between two runs of one seed whatever held-out does: time, the job cache's counts,
# and USD (jobs are priced by their wall time); the cumulative totals also count held-out spend.
VOLATILE = ("seconds_", "cache_", "usd", "tokens_cumulative")


def _run(tmp_path, run_id: str, *overrides: str) -> list[dict]:
    from agent_trainer.commands import train as at_train

    at_train.run(compose_config([f"runs_dir={tmp_path}", f"run_id={run_id}", "experiment=smoke", "inner.cache=false",
                                 *overrides], "train"))
    return [json.loads(x) for x in (tmp_path / run_id / "metrics.jsonl").read_text().splitlines()]


def training_keys(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(("heldout_", *VOLATILE))}


def test_start_and_end_on_the_same_seeds_without_changing_training(tmp_path, built_agent, monkeypatch):
    import agent_trainer.outer_loop.rl.rollouts
    from agent_trainer.outer_loop.episode.episode import Episode

    seeds: dict[str, int] = {}

    class Recorded(Episode):
        def __init__(self, *args, **kwargs):
            seeds[kwargs["episode_id"]] = kwargs["seed"]
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(agent_trainer.outer_loop.rl.rollouts, "Episode", Recorded)
    on = _run(tmp_path, "on", "outer.heldout_every=1", "outer.heldout_episodes=2", "task.held_out_families=[triage]")
    off = _run(tmp_path, "off", "outer.heldout_every=0", "tracking=off")

    # start: step 0 before its update; end: step 1 after its update; nothing periodic in the last step
    assert "heldout_reward_mean" in on[0] and "heldout_end_reward_mean" not in on[0]
    assert "heldout_reward_mean" not in on[1] and "heldout_end_reward_mean" in on[1]
    for row, p in ((on[0], "heldout_"), (on[1], "heldout_end_")):
        assert len(row[p + "rewards"]) == 2
        assert row[p + "reward_lo"] <= row[p + "reward_mean"] <= row[p + "reward_hi"]
    assert on[1]["heldout_gain"] == pytest.approx(on[1]["heldout_end_reward_mean"] - on[0]["heldout_reward_mean"])
    assert on[1]["heldout_gain_lo"] <= on[1]["heldout_gain"] <= on[1]["heldout_gain_hi"]
    assert on[0]["seconds_heldout"] > 0 and not any(k.startswith("heldout_") for r in off for k in r)

    # the same episode seeds at both evaluations, none shared with a training episode
    start = {k.split("-", 2)[2]: v for k, v in seeds.items() if k.startswith("s0000-heldout-")}
    end = {k.split("-", 3)[3]: v for k, v in seeds.items() if k.startswith("s0001-heldout-end-")}
    train = {v for k, v in seeds.items() if "-train-" in k}
    assert len(start) == 2 and start == end and not set(start.values()) & train
    assert sorted(start.values()) == sorted(hash((-1, 0, g)) % 2**31 for g in range(2)), "the same in every run"

    # training: every number the same with and without held-out evaluation
    assert [training_keys(r) for r in on] == [training_keys(r) for r in off]

    # MLflow: one held-out curve, the end one step past the last training step; the gain at the last step
    marker = json.loads((tmp_path / "on" / "outer_run.json").read_text())
    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    hist = read_metrics(uri, marker["mlflow_run_id"], ["heldout/heldout_reward_mean", "heldout/heldout_reward_hi",
                                                       "heldout/heldout_gain", "heldout/heldout_end_reward_mean"])
    curve = hist["heldout/heldout_reward_mean"]
    assert [s for s, _ in curve] == [0, 2] and [s for s, _ in hist["heldout/heldout_reward_hi"]] == [0, 2]
    assert [v for _, v in curve] == pytest.approx([on[0]["heldout_reward_mean"], on[1]["heldout_end_reward_mean"]])
    assert [s for s, _ in hist["heldout/heldout_gain"]] == [1]
    assert hist["heldout/heldout_gain"][0][1] == pytest.approx(on[1]["heldout_gain"])
    assert hist["heldout/heldout_end_reward_mean"] == []

    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["heldout_start"] == on[0]["heldout_reward_mean"]
    assert summary["heldout_end"] == on[1]["heldout_end_reward_mean"]
    assert summary["heldout_gain_ci"] == [on[1]["heldout_gain_lo"], on[1]["heldout_gain_hi"]]
    assert (tmp_path / "on" / "plots" / "heldout.png").is_file()
