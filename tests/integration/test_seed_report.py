"""at-compare's seed report on a real SQLite MLflow store: a sweep folder of three at-train-like runs
(seed=0,1,2) logged as at-train logs them (grouped names, held-out at step 0 and one past the last
step, the paired gain at the last step), read back through ``agent_trainer.commands.compare.run``."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from agent_trainer.config import compose_config
from agent_trainer.tracking import Tracker, metric_key

STEPS = 6
# seed -> the training gain's interval (at-train logs it at the last step, from the episodes)
TRAIN_CI = {0: (0.05, 0.29), 1: (-0.05, 0.17), 2: (0.08, 0.34)}
# seed -> (reward per step, held-out start, held-out end, paired gain and interval)
RUNS = {
    0: ([0.30, 0.32, 0.34, 0.45, 0.50, 0.52], 0.20, 0.30, (0.10, 0.04, 0.16)),
    1: ([0.35, 0.33, 0.37, 0.40, 0.41, 0.42], 0.25, 0.24, (-0.01, -0.06, 0.04)),
    2: ([0.28, 0.30, 0.29, 0.50, 0.52, 0.49], 0.22, 0.33, (0.11, 0.05, 0.17)),
}


def _log_run(uri: str, tmp: Path, seed: int, lr: float = 2e-3) -> str:
    rewards, start, end, (gain, glo, ghi) = RUNS[seed]
    params = {"seed": seed, "outer": {"lr": lr}, "agent": {"model": "tiny-agent"}, "run_id": f"sw/{seed}"}
    with Tracker(uri, experiment="seeds", run_name=f"train seed={seed}", artifact_location=str(tmp / "mlartifacts"),
                 tags={"command": "at-train"}) as tr:
        tr.log_config(params)
        for step, r in enumerate(rewards):
            m = {"reward_mean": r, "valid_first_try": 0.6 + 0.05 * step}
            if step % 2 == 0:   # steps where no episode chose SFT log no share (at-train's step_metrics)
                m["share_algorithm_sft"] = 0.5 + 0.1 * step
            if step == 0:
                m.update(heldout_reward_mean=start, heldout_reward_lo=start - 0.05, heldout_reward_hi=start + 0.05)
            if step == STEPS - 1:
                m.update(heldout_gain=gain, heldout_gain_lo=glo, heldout_gain_hi=ghi,
                         reward_gain_lo=TRAIN_CI[seed][0], reward_gain_hi=TRAIN_CI[seed][1])
            tr.log_metrics({metric_key(k): v for k, v in m.items()}, step=step)
        tr.log_metrics({metric_key("heldout_reward_mean"): end, metric_key("heldout_reward_lo"): end - 0.05,
                        metric_key("heldout_reward_hi"): end + 0.05}, step=STEPS)   # the end: after the last update
    return tr.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seeds")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    for sweep, lrs in (("sweep", [2e-3]), ("grid", [2e-3, 1e-3])):
        for i, (lr, seed) in enumerate((lr, seed) for lr in lrs for seed in RUNS):
            folder = tmp / sweep / str(i)
            folder.mkdir(parents=True)
            rid = _log_run(uri, tmp, seed, lr)
            (folder / "run.json").write_text(json.dumps({"mlflow_run_id": rid, "tracking_uri": uri,
                                                         "command": "at-train", "status": "ok"}))
    return tmp


def _compare(tmp: Path, out: str, entry: str) -> dict:
    from agent_trainer.commands import compare as at_compare

    cfg = compose_config([f"runs_dir={tmp}", f"run_id={out}", f"out={tmp / out}", f"runs=['{tmp / entry}']"],
                         "compare")
    return at_compare.run(cfg)


def _csv(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_seed_report_rows_and_mean(store, capsys):
    paths = _compare(store, "cmp", "sweep")
    assert paths["seeds"] == store / "cmp" / "seeds.md"
    rows = _csv(store / "cmp" / "seeds.csv")
    assert [r["seed"] for r in rows] == ["0", "1", "2", "mean", "sd"]
    gains = []
    for r in rows[:3]:
        rewards, start, end, (gain, glo, ghi) = RUNS[int(r["seed"])]
        first, last = statistics.fmean(rewards[:3]), statistics.fmean(rewards[-3:])
        gains.append(last - first)
        assert float(r["reward_first3"]) == pytest.approx(first) and float(r["reward_last3"]) == pytest.approx(last)
        assert float(r["reward_gain"]) == pytest.approx(last - first)
        assert (float(r["reward_gain_lo"]), float(r["reward_gain_hi"])) == pytest.approx(TRAIN_CI[int(r["seed"])])
        assert float(r["heldout_start"]) == pytest.approx(start) and float(r["heldout_end"]) == pytest.approx(end)
        assert float(r["heldout_start_lo"]) == pytest.approx(start - 0.05)
        assert float(r["heldout_end_hi"]) == pytest.approx(end + 0.05)
        assert (float(r["heldout_gain"]), float(r["heldout_gain_lo"]), float(r["heldout_gain_hi"])) == \
            pytest.approx((gain, glo, ghi))
        # the share is missing at odd steps (no SFT there): those count as 0
        assert float(r["share_algorithm_sft_first3"]) == pytest.approx((0.5 + 0 + 0.7) / 3)
        assert float(r["share_algorithm_sft_last3"]) == pytest.approx((0 + 0.9 + 0) / 3)
        assert float(r["valid_first_try_first3"]) == pytest.approx(0.65)
    assert float(rows[3]["reward_gain"]) == pytest.approx(statistics.fmean(gains))
    assert float(rows[4]["reward_gain"]) == pytest.approx(statistics.stdev(gains))
    assert float(rows[3]["heldout_gain"]) == pytest.approx(statistics.fmean(g for *_, (g, _, _) in RUNS.values()))
    md = (store / "cmp" / "seeds.md").read_text()
    assert "| 0 | 0.320 -> 0.490 | +0.170 [+0.050, +0.290] | 0.200 [0.150, 0.250] | 0.300 [0.250, 0.350] | +0.100 [+0.040, +0.160] |" in md
    assert "**mean ± sd (3 seeds)**" in md
    # seed 0 gains 0.170, seed 1 0.060, seed 2 0.213: two above 0.10; held-out intervals above 0: seeds 0 and 2
    assert "training gain above 0.10: **2 of 3**" in md and "held-out gain interval lies above 0: **2 of 3**" in md
    assert "training gain interval lies above 0: **2 of 3**" in md   # seeds 0 and 2
    # the mean over seeds with Student's t (2 df: 4.303): 0.1478 ± 4.303 * sd / sqrt(3)
    m, sd = statistics.fmean(gains), statistics.stdev(gains)
    assert (f"training gain **{m:+.3f} [{m - 4.303 * sd / 3 ** 0.5:+.3f}, {m + 4.303 * sd / 3 ** 0.5:+.3f}]**"
            in md), md
    assert md in capsys.readouterr().out, "at-compare prints the seed report"


def test_seed_report_per_setting_when_more_than_seed_differs(store, monkeypatch):
    import agent_trainer.outer_loop.report.plots as plots

    drawn = {}
    save = plots.save_figure

    def spy(fig, path):   # each panel's points as drawn: (x, y) of the markers, the legend
        drawn[Path(path).name] = [([tuple(np.round(line.get_xydata()[0], 4)) for line in ax.lines
                                    if line.get_marker() in ("o", "s")],
                                   [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [])
                                  for ax in fig.axes]
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", spy)
    paths = _compare(store, "cmp_grid", "grid")
    rows = _csv(store / "cmp_grid" / "seeds.csv")
    assert [(r["setting"], r["seed"]) for r in rows] == \
        [(s, x) for s in ("lr=0.002", "lr=0.001") for x in ("0", "1", "2", "mean", "sd")]
    md = (store / "cmp_grid" / "seeds.md").read_text()
    assert "## lr=0.002" in md and "## lr=0.001" in md and md.count("mean ± sd (3 seeds)") == 2
    # seeds.png: the training and held-out gains, each seed's and the mean's, one colour per setting side by side
    assert paths["seeds_plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (train, train_legend), (held, _) = drawn["seeds.png"]
    assert train_legend == ["lr=0.002", "lr=0.001"]
    first = [r for r in rows if r["setting"] == "lr=0.002"]
    expected = [(x - 0.175, round(float(r["reward_gain"]), 4)) for x, r in enumerate(first[:4])]
    assert train[:4] == [pytest.approx(p) for p in expected], "x: seed 0, 1, 2, then the mean; y: the gains"
    assert held[3] == pytest.approx((3 - 0.175, round(float(first[3]["heldout_gain"]), 4)))


def test_no_seed_report_when_seeds_do_not_differ(store):
    (store / "cmp_one").mkdir()
    (store / "cmp_one" / "seeds.md").write_text("stale")
    (store / "cmp_one" / "seeds.png").write_text("stale")
    paths = _compare(store, "cmp_one", "sweep/0")
    assert "seeds" not in paths and not (store / "cmp_one" / "seeds.md").exists()
    assert not (store / "cmp_one" / "seeds.png").exists()
