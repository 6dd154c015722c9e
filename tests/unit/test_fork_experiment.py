"""The fork experiment's counting on hand-made episode folders and rows: the paper's switch rate, suggestion
adoption per type, the pooled-rate interval, fork points, switch:other and the paired branch table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent_trainer.outer_loop.report.bootstrap import ratio_ci
from agent_trainer.outer_loop.strategy import fork, fork_table, protocol
from agent_trainer.outer_loop.strategy.switch_rates import agent_rates, episode_counts, episode_dirs, rates_markdown

CURATED = {"sources": [{"family": "calc_chain", "size": 100}]}


def _job(ep: Path, i: int, algorithm: str, *, lora: bool = False, base: str = "tiny-s", data=None,
         status: str = "ok", steps: int = 20, score: float | None = 0.2) -> None:
    """Job ``i`` (0-based) of an episode folder: the snapshot's job.yaml and the result.json the harness writes."""
    d = ep / "jobs" / f"{i:02d}"
    (d / "job").mkdir(parents=True)
    (d / "output").mkdir(parents=True)
    spec = {"base_model": base, "algorithm": algorithm, "data": data or CURATED, **({"peft": {"r": 8}} if lora else {})}
    (d / "job" / "job.yaml").write_text(yaml.safe_dump(spec))
    (d / "output" / "result.json").write_text(json.dumps({
        "status": status, "steps": steps if status == "ok" else 0, "base_model": base,
        "hidden_score": score if status == "ok" else None}))


def _trajectory(ep: Path, events: list[dict]) -> None:
    ep.mkdir(parents=True, exist_ok=True)
    (ep / "trajectory.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_switch_rate_counts_algorithm_peft_and_base_model_changes(tmp_path):
    a = tmp_path / "run_a" / "episodes" / "0"
    _job(a, 0, "sft")
    _job(a, 1, "sft", lora=True)                      # PEFT changed
    _job(a, 2, "grpo", status="invalid")              # not executed: not part of any pair
    _job(a, 3, "sft", lora=True)                      # same as job 2: no switch
    _job(a, 4, "grpo", lora=True, base="tiny-m")      # algorithm and base model: one switch, two components
    _job(a, 5, "grpo", lora=True, base="tiny-m", data={"file": "data.jsonl"})  # data source only: not the paper's
    _trajectory(a, [
        {"event": "adoption", "type": "execution", "target": "learning_rate", "adopted": True},
        {"event": "adoption", "type": "execution", "target": "max_steps", "adopted": False},
        {"event": "adoption", "type": "strategy", "target": "algorithm", "adopted": False},
        {"event": "adoption", "type": "strategy", "target": "algorithm", "adopted": True, "replayed": True},
    ])
    b = tmp_path / "run_b" / "episodes" / "0"
    _job(b, 0, "sft")                                 # one executed job: no pair
    _trajectory(b, [{"event": "adoption", "type": "execution", "target": "learning_rate", "adopted": True}])

    c = episode_counts(a)
    assert (c["executed"], c["pairs"], c["switches"]) == (5, 4, 2)
    assert (c["changed_algorithm"], c["changed_peft"], c["changed_base_model"]) == (1, 1, 1)
    assert c["switches_pdg"] == 3                     # the project's labels also count the data source
    assert (c["suggestions_execution"], c["adopted_execution"], c["suggestions_strategy"], c["adopted_strategy"]) \
        == (2, 1, 1, 0)                               # the replayed record is the source's, not this episode's

    eps = episode_dirs([tmp_path / "run_a", tmp_path / "run_b"])
    assert eps == [a, b]
    row = agent_rates("trained", eps)
    assert (row["episodes"], row["pairs"], row["switches"]) == (2, 4, 2)
    assert row["switch_rate"] == pytest.approx(0.5) and row["switch_rate_ci"] == [0.5, 0.5]  # one episode has pairs
    assert (row["suggestions_execution"], row["adopted_execution"]) == (3, 2)
    md = rates_markdown([row])
    assert len(md) == 4 and "| trained | 2 | 4 | 2 | 50.0% [50.0%, 50.0%] | 1/1/1 | 75.0% | 2/3 | 0/1 |" in md
    assert md[-1].startswith("| paper (arXiv 2608.19072) |") and "2.1%" in md[-1] and "22/22 | 0/21 |" in md[-1]


def test_ratio_ci_pools_and_resamples_units():
    rate, lo, hi = ratio_ci([0, 1, 3, 0], [2, 2, 4, 0])   # the last unit has no pair: dropped
    assert rate == pytest.approx(4 / 8)
    assert 0 <= lo < rate < hi <= 0.75
    assert ratio_ci([1], [0]) is None
    with pytest.raises(ValueError):
        ratio_ci([1, 2], [3])


def _source_episode(run: Path, labels: list[str | None], score: float = 0.2) -> Path:
    """An at-episode-like episode folder: each job's result reached the conversation before the next turn."""
    ep = run / "episodes" / "0"
    events = [{"event": "message", "role": "system", "content": "s"}, {"event": "message", "role": "user",
                                                                        "content": "u"}]
    for i, alg in enumerate(labels):
        _job(ep, i, alg or "sft", status="ok" if alg else "invalid", score=score)
        events += [{"event": "message", "role": "assistant", "content": "",
                    "tool_calls": [{"id": f"c{i}", "function": {"name": "submit_job", "arguments": "{}"}}]},
                   {"event": "message", "role": "tool", "name": "submit_job", "tool_call_id": f"c{i}",
                    "content": "job status: ok"},
                   {"event": "job", "job": i + 1}]
    _trajectory(ep, events)
    return ep


def test_fork_points_take_job_1_of_every_episode_first(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    _source_episode(runs[0], ["sft", "grpo", "sft"])
    _source_episode(runs[1], [None, "sft"])           # job 1 did not train: no point after it
    _source_episode(runs[2], ["grpo", "grpo"])
    pts = fork.fork_points(runs, 4, max_jobs_per_episode=3)
    assert [(p.run_dir.name, p.at) for p in pts] == [("a", 1), ("c", 1), ("a", 2), ("b", 2)]
    assert [p.current.algorithm for p in pts] == ["sft", "grpo", "grpo", "sft"]
    with pytest.raises(fork.ForkError, match="5 fork point"):
        fork.fork_points(runs, 6, max_jobs_per_episode=3)   # c's job 2 leaves no job: 5 points in all


def test_switch_other_names_the_other_algorithm(tmp_path):
    def src(alg):
        return fork.Source(run_dir=tmp_path, episode_dir=tmp_path, episode_id="0", at=1, events=[], jobs_total=2,
                           current=protocol.Current(alg, "curated", alg), adapter="lora")

    b = fork.make_branch("switch:other", src("sft"))
    assert (b.name, b.slug, b.target) == ("switch:other", "switch-other", "grpo")
    assert b.message.startswith("Switch to GRPO instead of SFT: your next job must use algorithm grpo")
    assert fork.make_branch("switch:other", src("grpo")).target == "sft"
    assert fork.make_branch("switch:full", src("sft")).target == "full"   # a named switch keeps its target
    with pytest.raises(fork.ForkError, match="no job up to job 1 trained"):
        fork.make_branch("switch:other", src(None))


def test_written_algorithm_and_carried_out(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "job.yaml").write_text(yaml.safe_dump({"stages": [{"algorithm": "SFT"}, {"algorithm": "grpo"}]}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "job.yaml").write_text("- not a mapping")
    assert fork.written_algorithm(tmp_path / "a") == "sft>grpo"
    assert fork.written_algorithm(tmp_path / "b") == "unreadable"
    assert fork.written_algorithm(tmp_path / "none") == "none"
    two = {"stages": [{"algorithm": "sft", "steps": 10, "peft": "lora"}, {"algorithm": "grpo", "steps": 5,
                                                                          "peft": "lora"}]}
    assert fork.carried_out("grpo", two) and fork.carried_out("sft>grpo", two) and fork.carried_out("lora", two)
    assert not fork.carried_out("full", two) and not fork.carried_out("dpo", two)
    assert not fork.carried_out("grpo", {"stages": [{"algorithm": "grpo", "steps": 0}]})   # trained nothing


def _row(point: int, branch: str, final: float, *, switches: int = 0, nxt: str = "sft", target=None,
         followed=None, decision="CONTINUE") -> dict:
    return {"point": point, "branch": branch, "final_score": final, "score_at_fork": 0.2, "switches_after_fork":
            switches, "executed_after_fork": 1, "target": target, "next_algorithm": nxt, "followed": followed,
            "decision": decision, "reward": final + 0.3, "usd": 0.001, "strategy": "a | b",
            "reply_prompt_tokens": 900}


def test_paired_table_of_branches_against_continue(tmp_path):
    rows = []
    for p, (c, s, r) in enumerate([(0.2, 0.4, 0.2), (0.3, 0.3, 0.1), (0.1, 0.5, 0.1)]):
        rows += [_row(p, "continue", c),
                 _row(p, "switch:other", s, switches=int(s != c), nxt="grpo" if s != c else "sft", target="grpo",
                      followed=s != c, decision="SWITCH"),
                 _row(p, "reconsider", r, nxt="none", decision="MALFORMED")]
    table = fork_table.summarize(rows)
    assert table["points"] == 3 and [b["branch"] for b in table["branches"]] == ["continue", "switch:other",
                                                                                  "reconsider"]
    cont, sw, rec = table["branches"]
    assert cont["vs_continue"] == (0.0, 0.0, 0.0) and (cont["wins"], cont["ties"], cont["losses"]) == (0, 3, 0)
    mean, lo, hi = sw["vs_continue"]
    assert mean == pytest.approx((0.2 + 0.0 + 0.4) / 3) and lo <= mean <= hi
    assert (sw["wins"], sw["ties"], sw["losses"]) == (2, 1, 0)
    assert (rec["wins"], rec["ties"], rec["losses"]) == (0, 2, 1)
    assert sw["switched_points"] == 2 and sw["next_algorithm"] == {"grpo": 2, "sft": 1} and sw["followed"] == [2, 3]
    assert sw["named"] == {"grpo": 3} and rec["next_algorithm"] == {"none": 3} and rec["followed"] is None
    assert rec["decision"] == {"MALFORMED": 3}
    md, js = fork_table.write(table, [], rows, tmp_path)
    text = md.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert len(lines) == 1 + 3 and lines[2].startswith("| switch:other | 3 | 0.4000 [")
    assert "| 2/1/0 | 2/3 | grpo 3 | grpo 2, sft 1 | 2/3 | SWITCH 3 | 900 |" in lines[2]
    assert "47.76%" in text and "65.20%" in text
    data = json.loads(js.read_text())
    assert len(data["rows"]) == 9 and data["paper"]["fork"]["switch"] == 0.652 and data["paper"]["switch_rate"] == 0.021
    m = fork_table.metrics(table)
    assert m["vs_continue_switch_other"] == pytest.approx(mean) and "vs_continue_continue" not in m
    with pytest.raises(ValueError, match="continue"):
        fork_table.summarize([r for r in rows if not (r["point"] == 1 and r["branch"] == "continue")])
