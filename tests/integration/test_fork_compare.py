"""at-fork and at-compare end to end on the CPU default: the tiny agent makes a two-job source episode,
the fork replays it to job 1 and runs continue / switch / reconsider branches, at-compare reads MLflow;
the fork experiment (at-fork points=1 over two copies of the source) pairs the branches with continue."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

from agent_trainer.config import compose_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TASK = str(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
COMMON = [f"task.spec_path={TASK}", "agent=tiny_local", "inner=fast", "hardware.threads_per_job=1"]


def _events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def forked(tmp_path_factory, built_agent):
    from agent_trainer.outer_loop.strategy.strategy import job_labels
    from agent_trainer.commands import episode as at_episode
    from agent_trainer.commands import fork as at_fork

    # The first episode seed whose first job trained: the fork point (the tiny agent writes invalid jobs too).
    # Each try has its own runs folder, so its MLflow store holds one source episode.
    for seed in range(6):
        runs = tmp_path_factory.mktemp(f"forks{seed}")
        at_episode.run(compose_config([f"runs_dir={runs}", "run_id=src", f"seed={seed}",
                                       "budget.max_jobs_per_episode=2", "agent.max_turns=10", *COMMON], "episode"))
        first = job_labels(runs / "src" / "episodes" / "0" / "jobs")
        if first and first[0]["label"]:
            break
    assert first and first[0]["label"], "the tiny agent's first job trained in one of 6 seeds (a fork point exists)"
    other = "sft" if first[0]["ran"]["stages"][-1]["algorithm"] == "grpo" else "grpo"
    cfg = compose_config([f"runs_dir={runs}", "run_id=fork", "run=src", "at=1",
                          f"branches=[continue,switch:{other},reconsider]"], "fork")
    rows = at_fork.run(cfg)
    return {"runs": runs, "rows": rows, "other": other, "cfg": cfg, "first": first[0]}


def test_fork_writes_table_and_plot(forked):
    fork = forked["runs"] / "fork"
    with open(fork / "comparison.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [r["branch"] for r in table] == ["continue", f"switch:{forked['other']}", "reconsider"]
    md = (fork / "comparison.md").read_text()
    assert md.count("\n") == 2 + 3 and "switches_after_fork" in md
    png = (fork / "fork.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for row, r in zip(table, forked["rows"]):
        assert float(row["reward"]) == pytest.approx(r["reward"])
        summary = json.loads((fork / "episodes" / r["branch"].replace(":", "-") / "summary.json").read_text())
        assert summary["reward"]["total"] == pytest.approx(r["reward"])
        assert summary["strategy"]["jobs"][0]["label"] == forked["first"]["label"]   # job 1 is the source's


def _after_shared_prefix(src_run: Path, fork_run: Path, names: list[str]) -> tuple[list[dict], int, dict]:
    """Each branch starts with the source's messages up to job 1's result and has the source's remaining budget;
    returns the source's records, the index of its job-1 record and each branch's messages after the prefix."""
    src = _events(src_run / "episodes" / "0" / "trajectory.jsonl")
    cut = next(i for i, e in enumerate(src) if e.get("event") == "job")
    src_msgs = [e for e in src[:cut] if e.get("event") == "message"]
    src_turns = sum(m["role"] == "assistant" for m in src_msgs)
    records = [json.loads(x) for x in (fork_run / "ledger.jsonl").read_text().splitlines()]
    messages = {}
    for name in names:
        ev = _events(fork_run / "episodes" / name / "trajectory.jsonl")
        msgs = [e for e in ev if e.get("event") == "message"]
        assert [(m["role"], m.get("content")) for m in msgs[:len(src_msgs)]] == \
            [(m["role"], m.get("content")) for m in src_msgs]
        assert (fork_run / "episodes" / name / "jobs" / "00" / "output" / "result.json").is_file()
        # the prefix's spending is the branch's: replayed LLM calls and job 1, then its own turns within the cap
        mine = [r for r in records if r["episode"] == name]
        assert sum(r["kind"] == "llm" and r.get("replayed", False) for r in mine) == src_turns
        assert mine[src_turns]["kind"] == "job"
        assert sum(r["kind"] == "llm" for r in mine) <= 10 and sum(r["kind"] == "job" for r in mine) <= 2
        messages[name] = msgs[len(src_msgs):]
    return src, cut, messages


def test_branches_start_from_the_same_point_with_the_same_budget(forked):
    runs, other = forked["runs"], forked["other"]
    src, cut, messages = _after_shared_prefix(runs / "src", runs / "fork", ["continue", f"switch-{other}",
                                                                            "reconsider"])
    assert not any(m["role"] == "user" for m in messages["continue"][:1])
    assert messages[f"switch-{other}"][0]["content"].startswith(f"Switch to {other.upper()} instead of ")
    assert messages["reconsider"][0]["content"] == "Reconsider your strategy."
    # same seed, same prompt: the continue branch's next turn is the source's own continuation
    src_next = next(e for e in src[cut:] if e.get("event") == "message" and e["role"] == "assistant")
    cont_next = next(m for m in messages["continue"] if m["role"] == "assistant")
    assert ((cont_next.get("content"), cont_next.get("tool_calls"))
            == (src_next.get("content"), src_next.get("tool_calls")))


def test_nested_mlflow_runs(forked):
    cfg = forked["cfg"]
    client = MlflowClient(tracking_uri=str(cfg.tracking.tracking_uri))
    exp = client.get_experiment_by_name(str(cfg.tracking.experiment))
    (parent,) = client.search_runs([exp.experiment_id], "tags.command = 'at-fork'")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.tags["branch"] for c in children) == sorted(r["branch"] for r in forked["rows"])
    for c in children:
        row = next(r for r in forked["rows"] if r["branch"] == c.data.tags["branch"])
        assert c.data.metrics["reward_total"] == pytest.approx(row["reward"])
        assert c.data.metrics["switches_after_fork"] == row["switches_after_fork"]
    assert ({"comparison.md", "comparison.csv", "fork.png"}
            <= {a.path for a in client.list_artifacts(parent.info.run_id)})


def test_compare_two_runs_matches_mlflow(forked, tmp_path):
    from agent_trainer.commands import compare as at_compare

    cfg = forked["cfg"]
    client = MlflowClient(tracking_uri=str(cfg.tracking.tracking_uri))
    exp = client.get_experiment_by_name(str(cfg.tracking.experiment))
    (src,) = client.search_runs([exp.experiment_id], "tags.command = 'at-episode'")
    (branch,) = client.search_runs([exp.experiment_id], "tags.branch = 'reconsider'")
    ids = [src.info.run_id, branch.info.run_id]
    paths = at_compare.run(compose_config([f"runs_dir={forked['runs']}", "run_id=cmp", f"runs=[{ids[0]},{ids[1]}]",
                                           f"out={tmp_path}"], "compare"))
    with open(tmp_path / "compare.csv") as fh:
        table = {r["run_id"]: r for r in csv.DictReader(fh)}
    assert set(table) == set(ids)
    data = json.loads((tmp_path / "plot_data.json").read_text())
    for i, rid in enumerate(ids):
        m = client.get_run(rid).data.metrics
        row = table[rid]
        assert float(row["reward"]) == pytest.approx(m["reward_total"])
        assert float(row["validation"]) == pytest.approx(m["reward_validation"])
        assert float(row["usd"]) == pytest.approx(m["usd"])
        if m["reward_total"] > 0:
            assert float(row["usd_per_reward"]) == pytest.approx(m["usd"] / m["reward_total"])
        assert data["stages"]["quality"][i] == pytest.approx(m["reward_quality"])
        if "cost" in data:  # drawn when a run has a positive reward (USD per unit of reward)
            assert data["cost"]["usd"][i] == pytest.approx(m["usd"])
        name = data["stages"]["runs"][i]
        hist = [[h.step, h.value] for h in client.get_metric_history(rid, "job_hidden_score")]
        assert sorted(data["job_scores"][name]) == sorted(hist) and hist
        assert data["reward_curves"][name]["points"] == [[h.step, h.value] for h in
                                                         client.get_metric_history(rid, "reward_total")]
    panels = {"reward_curves": "reward_curves", "stages": "stages", "switches": "switch_rates", "adoption": "adoption",
              "cost": "cost"}
    for name, panel in panels.items():  # a PNG is drawn, or plot_data.json says why not (no run logged that)
        if panel in data["skipped"]:
            assert name not in paths and not (tmp_path / f"{name}.png").exists()
            continue
        png = paths[name].read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000
    assert {"reward_curves", "stages"} <= set(paths)
    assert (tmp_path / "compare.md").read_text().count(ids[0]) == 1


@pytest.fixture(scope="module")
def fork_points(forked, tmp_path_factory):
    """``at-fork points=1`` over two copies of the source episode (the first in natural order is the fork point;
    its branch jobs are mostly job-cache hits of the fork above), in a runs folder of its own (its MLflow store
    holds only this at-fork). One point keeps the test cheap; the pairing over points is tested on hand-made rows
    (tests/unit/test_fork_experiment.py)."""
    from agent_trainer.commands import fork as at_fork

    out = tmp_path_factory.mktemp("fork_points")
    for name in ("src_a", "src_b"):
        shutil.copytree(forked["runs"] / "src", out / name, symlinks=True)
    res = at_fork.run(compose_config([f"runs_dir={out}", "run_id=points", "run=src_*", "points=1",
                                      "branches=[continue,switch:other,reconsider]"], "fork"))
    return {"out": out, "res": res, "other": forked["other"]}


def test_fork_points_share_the_prefix_and_budget(fork_points):
    out, other = fork_points["out"], fork_points["other"]
    _, _, messages = _after_shared_prefix(out / "src_a", out / "points", ["p00-continue", "p00-switch-other",
                                                                          "p00-reconsider"])
    assert messages["p00-switch-other"][0]["content"].startswith(f"Switch to {other.upper()} instead of ")
    assert messages["p00-reconsider"][0]["content"] == "Reconsider your strategy."
    assert sorted(p.name for p in (out / "points" / "episodes").iterdir()) == [
        "p00-continue", "p00-reconsider", "p00-switch-other"]


def test_fork_table_pairs_each_branch_with_continue(fork_points):
    out, other = fork_points["out"], fork_points["other"]
    data = json.loads((out / "points" / "fork_table.json").read_text())
    assert data == json.loads(json.dumps(fork_points["res"], default=str)) | {"paper": data["paper"]}
    table, rows = data["table"], data["rows"]
    assert table["points"] == 1
    assert [b["branch"] for b in table["branches"]] == ["continue", "switch:other", "reconsider"]
    assert sorted((r["point"], r["branch"]) for r in rows) == sorted(
        (0, b) for b in ("continue", "switch:other", "reconsider"))
    final = {(r["point"], r["branch"]): r["final_score"] for r in rows}
    for b in table["branches"]:
        diff = final[(0, b["branch"])] - final[(0, "continue")]
        assert b["points"] == 1 and b["vs_continue"] == [pytest.approx(diff)] * 3   # one point: no spread
    for r in rows:
        summary = json.loads((out / "points" / "episodes" / f"p{r['point']:02d}-{r['branch'].replace(':', '-')}"
                              / "summary.json").read_text())
        scores = [j["hidden_score"] for j in summary["strategy"]["jobs"] if j["hidden_score"] is not None]
        assert r["final_score"] == scores[-1] and r["score_at_fork"] == scores[0]
        assert r["next_algorithm"] in ("none", "unreadable") or set(r["next_algorithm"].split(">")) <= {
            "sft", "grpo", "dpo", "distill", "?"}
        if r["branch"] == "switch:other":
            assert r["target"] == other and isinstance(r["followed"], bool)
    (forked_agent,) = data["rates"]
    assert forked_agent["episodes"] == 2 and forked_agent["runs"] == ["src_a", "src_b"]
    md = (out / "points" / "fork_table.md").read_text()
    assert sum(ln.startswith("| ") for ln in md.splitlines()) == (1 + 3) + (1 + 2)   # branches; agent + paper rates
