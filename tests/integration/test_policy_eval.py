"""scripts/policy_eval.py on a real at-train run of the tiny agent: a run's policies played again on fixed seeds
give back the run's own held-out rewards to the digit, the paired gain is their difference, the warm start is
played once for seeds that share it, and a wrong step or folder is one line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_trainer.config import compose_config

# One worker runs the whole module under make test (tests/conftest.py, ONE_WORKER_MODULES): its module fixtures'
# runs are built once.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HELD = ["task.held_out_families=[reverse_text,unit_convert]", "outer.heldout_every=100",
        "outer.heldout_episodes=3", "outer.heldout_at_start=true"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, built_agent):
    """Two seeds of the smoke experiment with a held-out start and end (2 steps each): seed 0 with tracking off
    (read from its folder), seed 1 tracked in MLflow."""
    from agent_trainer.commands import train as at_train

    root = tmp_path_factory.mktemp("pe")
    for seed, tracking in ((0, "tracking=off"), (1, "tracking=mlflow")):
        at_train.run(compose_config([f"runs_dir={root}", f"run_id=s{seed}", "experiment=smoke", f"seed={seed}",
                                     tracking, *HELD], "train"))
    return [root / "s0", root / "s1"]


@pytest.fixture(scope="module")
def evaluated(runs):
    """Seed 1 again, its training families also played at the start and the end (outer.train_eval_episodes)."""
    from agent_trainer.commands import train as at_train

    at_train.run(compose_config([f"runs_dir={runs[1].parent}", "run_id=s1-eval", "experiment=smoke", "seed=1",
                                 "tracking=mlflow", "outer.train_eval_episodes=2", *HELD], "train"))
    return runs[1].parent / "s1-eval"


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_replaying_the_heldout_families_gives_the_runs_own_rewards(runs):
    from agent_trainer.outer_loop.rl.policy_eval import evaluate_runs

    out = evaluate_runs(runs, families="heldout", episodes=3, steps=["start", "last"], progress=False)
    for run, row in zip(runs, out["runs"]):
        metrics = _rows(run)
        ev = row["evaluations"]
        assert list(ev) == ["start", "1"]
        assert ev["start"]["rewards"] == metrics[0]["heldout_rewards"]
        assert ev["1"]["rewards"] == metrics[-1]["heldout_end_rewards"]
        assert row["gain"]["gain"] == pytest.approx(metrics[-1]["heldout_gain"])
        assert [row["gain"]["lo"], row["gain"]["hi"]] == pytest.approx(
            [metrics[-1]["heldout_gain_lo"], metrics[-1]["heldout_gain_hi"]])
        assert set(row["gain"]["families"]) == {"reverse_text", "unit_convert"}
        saved = json.loads((run / "evals" / "heldout_e3" / "policy_eval.json").read_text())
        assert saved["evaluations"]["1"]["rewards"] == ev["1"]["rewards"]
    # the two seeds share the warm start: played once, for the first run
    assert "shared_with" not in out["runs"][0]["evaluations"]["start"]
    assert out["runs"][1]["evaluations"]["start"]["shared_with"] == str(runs[0])
    gains = [r["gain"]["gain"] for r in out["runs"]]
    assert out["mean_gain"]["gain"] == pytest.approx(sum(gains) / 2) and out["mean_gain"]["runs"] == 2
    assert out["mean_gain"]["lo"] <= out["mean_gain"]["gain"] <= out["mean_gain"]["hi"]


def test_the_run_plays_its_training_families_at_start_and_end(runs, evaluated):
    """outer.train_eval_episodes: the warm start and the last policy play every training task on the fixed seeds
    inside the run. The paired gain is what policy_eval gives after the run, to the digit; it reaches MLflow and
    the summary; and the training steps are the run's without the evaluation."""
    from agent_trainer.outer_loop.rl.policy_eval import evaluate_runs
    from agent_trainer.tracking import read_metrics

    rows = _rows(evaluated)
    start, end = rows[0]["train_eval_rewards"], rows[-1]["train_eval_end_rewards"]
    assert len(start) == len(end) == 4, "calc_chain and count_char, 2 episodes each"
    row = evaluate_runs([evaluated], families="train", episodes=2, progress=False)["runs"][0]
    assert row["evaluations"]["start"]["rewards"] == start and row["evaluations"]["1"]["rewards"] == end
    keys = ("paired_train_gain", "paired_train_gain_lo", "paired_train_gain_hi")
    assert [rows[-1][k] for k in keys] == pytest.approx([row["gain"][k] for k in ("gain", "lo", "hi")])
    assert rows[-1]["paired_train_start"] == row["evaluations"]["start"]["reward_mean"]
    summary = json.loads((evaluated / "summary.json").read_text())
    assert summary["paired_train_gain"] == rows[-1]["paired_train_gain"] and summary["paired_train_episodes"] == 2
    assert summary["paired_train_gain_ci"] == [rows[-1]["paired_train_gain_lo"], rows[-1]["paired_train_gain_hi"]]
    # MLflow: the start at step 0, the end at step 2 (after 2 updates), as the held-out evaluations
    run_id = json.loads((evaluated / "outer_run.json").read_text())["mlflow_run_id"]
    hist = read_metrics(f"sqlite:///{evaluated.parent.resolve()}/mlflow.db", run_id, ["eval/train_eval_reward_mean"])
    assert [s for s, _ in hist["eval/train_eval_reward_mean"]] == [0, 2]
    assert [v for _, v in hist["eval/train_eval_reward_mean"]] == pytest.approx(
        [rows[0]["train_eval_reward_mean"], rows[-1]["train_eval_end_reward_mean"]])
    # its episodes apart from the training ones (the training gain reads s<step>-train-*)
    names = {p.name.rsplit("-", 2)[0] for p in (evaluated / "episodes").iterdir()}
    assert {"s0000-traineval", "s0001-traineval-end"} <= names
    # the training steps as without the evaluation: episodes, rewards, update, spending (times, the job cache's
    # counts (a training job the evaluation ran first is a hit) and the run's cumulative spend aside)
    plain = _rows(runs[1])
    assert len(plain) == len(rows) == 2
    for with_eval, without in zip(rows, plain):
        same = {k: v for k, v in without.items() if not k.startswith(("seconds_", "cache_")) and "cumulative" not in k}
        assert len(same) > 40
        assert {k: with_eval.get(k) for k in same} == same


def test_a_run_resumed_for_more_steps_pairs_its_new_end_with_the_first_start(tmp_path, built_agent):
    """A one-step run with the training families' evaluation, continued to two steps (resume with a larger
    outer.steps): the new end is paired with the start the first step played, read back from metrics.jsonl."""
    from agent_trainer.commands import train as at_train

    base = [f"runs_dir={tmp_path}", "run_id=r", "experiment=smoke", "seed=3", "tracking=off",
            "outer.train_eval_episodes=1"]
    at_train.run(compose_config([*base, "outer.steps=1"], "train"))
    one = _rows(tmp_path / "r")
    assert len(one) == 1 and one[0]["paired_train_episodes"] == 1.0, "one step: start and end in its row"
    at_train.run(compose_config([*base, "outer.steps=2", f"resume={tmp_path / 'r'}"], "train"))
    rows = _rows(tmp_path / "r")
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["paired_train_start"] == one[0]["train_eval_reward_mean"]
    diffs = [b - a for a, b in zip(one[0]["train_eval_rewards"], rows[1]["train_eval_end_rewards"])]
    assert rows[1]["paired_train_gain"] == pytest.approx(sum(diffs) / len(diffs))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["paired_train_end"] == rows[1]["train_eval_end_reward_mean"]


def test_training_families_and_a_middle_step(runs, tmp_path, monkeypatch):
    import agent_trainer.outer_loop.report.plots as plots
    from agent_trainer.outer_loop.rl.policy_eval import evaluate_runs, markdown, plot

    out = evaluate_runs(runs[:1], families="train", episodes=2, steps=["start", 0, "last"], progress=False)
    row = out["runs"][0]
    assert list(row["evaluations"]) == ["start", "0", "1"]
    assert row["families"] == ["calc_chain", "count_char"]
    assert all(len(e["rewards"]) == 4 for e in row["evaluations"].values())
    assert row["gain"]["from"] == "start" and row["gain"]["to"] == "1"
    diffs = [b - a for a, b in zip(row["evaluations"]["start"]["rewards"], row["evaluations"]["1"]["rewards"])]
    assert row["gain"]["gain"] == pytest.approx(sum(diffs) / len(diffs))
    table = markdown(out)
    assert f"{row['gain']['gain']:+.3f}" in table and "calc_chain" in table
    # policy_eval.png: the reward against the updates each policy had (0: the warm start), as drawn
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig.axes[0].lines[0].get_xydata()))
    plot(out, tmp_path / "p.png")
    means = [row["evaluations"][k]["reward_mean"] for k in ("start", "0", "1")]
    assert drawn[0].ravel().tolist() == pytest.approx([0, means[0], 1, means[1], 2, means[2]])
    # each step's episodes in their own folders: s0000 the warm start, s0001 after step 0's update, s0002 after 1's
    folder = runs[0] / "evals" / "train_e2"
    names = {p.name[:5] for p in (folder / "episodes").iterdir()}
    assert names == {"s0000", "s0001", "s0002"}
    # Again with fewer steps: the same numbers; nothing of the first evaluation left in the folder, nor in the
    # ledger (its spending would count against the budget caps of the second)
    again = evaluate_runs(runs[:1], families="train", episodes=2, steps=["start", "last"], progress=False)["runs"][0]
    assert again["gain"] == row["gain"]
    assert {p.name[:5] for p in (folder / "episodes").iterdir()} == {"s0000", "s0002"}
    jobs = [json.loads(x) for x in (folder / "ledger.jsonl").read_text().splitlines() if '"job"' in x]
    submitted = sum(len(json.loads(p.read_text())["jobs"]) for p in folder.glob("episodes/*/summary.json"))
    assert submitted and len([j for j in jobs if j.get("kind") == "job"]) == submitted


def test_at_compare_shows_the_paired_training_gain_of_both_kinds_of_run(runs, tmp_path):
    """The evaluation reaches at-compare's seed report through MLflow (seed 1) and through the run folder (seed
    0, tracking off): a table of the seeds' paired training gains, their mean with its t interval, a third panel."""
    from agent_trainer.outer_loop.report.bootstrap import t_interval
    from agent_trainer.outer_loop.report.compare_runs import collect
    from agent_trainer.outer_loop.report.seed_report import write_seed_report
    from agent_trainer.outer_loop.rl.policy_eval import evaluate_runs

    out = evaluate_runs(runs, families="train", episodes=2, steps=["start", "last"], progress=False)
    gains = [r["gain"]["gain"] for r in out["runs"]]
    uri = f"sqlite:///{runs[1].parent.resolve()}/mlflow.db"
    data = collect(uri, [str(r) for r in runs])
    assert [d.metrics["paired_train_gain"] for d in data] == pytest.approx(gains)
    assert data[1].folder is not None and data[1].run_id != "s1", "seed 1 read from MLflow"
    assert data[1].metrics["paired_train_episodes"] == 2.0
    assert data[1].status == "FINISHED", "the evaluation adds to the finished run without reopening it"
    files = write_seed_report(data, tmp_path)
    md = files["seeds"].read_text()
    assert "Training families played on the same episode seeds" in md
    lo, hi = t_interval(gains)
    assert f"**{sum(gains) / 2:+.3f} [{lo:+.3f}, {hi:+.3f}]**" in md
    for g in out["runs"]:
        assert f"{g['gain']['gain']:+.3f} [{g['gain']['lo']:+.3f}, {g['gain']['hi']:+.3f}]" in md
    assert "paired_train_gain" in files["seeds_csv"].read_text().splitlines()[0]


@pytest.mark.parametrize("args, message", [
    (["--steps", "start,7"], "no checkpoint for step 7"),
    (["--steps", "first"], "--steps takes start, last or step numbers"),
    (["--families", "calc_chain,no_such_family"], "no task spec at"),
])
def test_user_mistakes_are_one_line(runs, args, message, capsys, monkeypatch):
    """The script's own ``main`` in this process (the command's start and exit code are the next test's), refused
    before any policy is built or played (the warm start's play took minutes before a missing step was named)."""
    import importlib.util

    from agent_trainer.outer_loop.rl import policy_eval

    def built(*a, **k):
        raise AssertionError("a policy was built before the mistake was named")

    monkeypatch.setattr(policy_eval, "RunEvaluator", built)

    spec = importlib.util.spec_from_file_location("policy_eval_script", ROOT / "scripts" / "policy_eval.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(runs[0]), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "policy_eval.py"), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "not an at-train run folder" in proc.stderr and "Traceback" not in proc.stderr


def test_only_the_last_policys_gain_over_the_warm_start_is_a_run_metric():
    """at-compare's column is the run's last policy against the warm start: a gain between other steps (or one
    saved before the run went on) stays in its policy_eval.json only."""
    from agent_trainer.outer_loop.rl.policy_eval import paired_metrics

    ev = {"start": {"reward_mean": 0.3}, "5": {"reward_mean": 0.4}, "11": {"reward_mean": 0.5}}
    row = {"label": "train", "episodes": 4, "last_step": 11, "evaluations": ev,
           "gain": {"from": "start", "to": "11", "gain": 0.2, "lo": 0.1, "hi": 0.3}}
    assert paired_metrics(row) == {"paired_train_start": 0.3, "paired_train_end": 0.5, "paired_train_gain": 0.2,
                                   "paired_train_gain_lo": 0.1, "paired_train_gain_hi": 0.3,
                                   "paired_train_episodes": 4.0}
    assert paired_metrics({**row, "gain": {**row["gain"], "to": "5"}}) == {}
    assert paired_metrics({**row, "last_step": 14}) == {}
    assert paired_metrics({**row, "gain": {**row["gain"], "from": "5"}}) == {}


def test_agents_against_people_on_two_tiny_runs(runs, tmp_path):
    """``at-compare mode=people`` on the two seeds: every row on a training family and a held-out one, on the same
    fixed seeds; the intervals hold their means, the two seeds' mean has the seeds as its unit, and an episode whose
    job was no valid job counts as uplift 0 and against the valid share, as its summary.json says."""
    from agent_trainer.commands import compare
    from agent_trainer.outer_loop.report.people import HELDOUT, TRAIN

    out = tmp_path / "people"
    compare.run(compose_config(["mode=people", f"runs=[{runs[0]},{runs[1]}]", "people.episodes=1",
                                "people.families=[calc_chain,reverse_text]", f"runs_dir={tmp_path}",
                                "+people.jobs.calc_chain=examples/jobs/sft_full",
                                "+people.jobs.reverse_text=examples/jobs/sft_lora", f"out={out}", "tracking=off"],
                               "compare"))
    table = json.loads((out / "people.json").read_text())
    assert [r["row"] for r in table["rows"]] == ["base", "handwritten", "teacher", "warm_start", "trained", "trained",
                                                 "trained_mean"]
    assert table["heldout"] == ["reverse_text"] and table["families"] == ["calc_chain", "reverse_text"]
    assert set(table["base"]["calc_chain"]) == {"tiny-s", "tiny-m"}
    for r in table["rows"][1:]:
        assert set(r["cells"]) == {"calc_chain", "reverse_text", TRAIN, HELDOUT}
        for c in r["cells"].values():
            assert c["lo"] <= c["uplift"] <= c["hi"] and 0 <= c["valid_share"] <= 1
    seeds = [r for r in table["rows"] if r["row"] == "trained"]
    mean = table["rows"][-1]["cells"][TRAIN]
    assert mean["unit"] == "seeds" and mean["uplift"] == pytest.approx(
        sum(r["cells"][TRAIN]["uplift"] for r in seeds) / 2)
    # read back from the episodes' own summaries: the teacher's (folder s9001 of the first run's evaluation)
    summaries = [json.loads(p.read_text())["reward"] for p in
                 sorted((runs[0] / "evals" / "calc_chain-reverse_text_e1" / "episodes").glob("s9001-*/summary.json"))]
    assert len(summaries) == 2
    teacher = table["rows"][2]["cells"]
    pooled = [teacher["calc_chain"], teacher["reverse_text"]]
    assert [c["valid_share"] for c in pooled] == [float(s["uplift"] is not None) for s in summaries]
    assert [c["uplift"] for c in pooled] == pytest.approx([s["uplift"] or 0.0 for s in summaries])
    lines = (out / "people.csv").read_text().splitlines()
    assert lines[0].startswith("row,label,run,model,seed,family,unit") and len(lines) == 1 + 2 + 6 * 4
    md = (out / "people.md").read_text()
    assert "| hand-written example job |" in md and "| trained tiny-agent, mean of 2 seeds |" in md
    assert "| trained tiny-agent, seed 1 (2 updates) |" in md
    assert (out / "people.png").stat().st_size > 10_000
