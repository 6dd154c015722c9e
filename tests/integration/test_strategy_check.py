"""``strategy=check`` end to end: at-episode with a scripted agent and four real tiny inner jobs.

The agent is scripted (a backend that replays fixed turns) because this tests the protocol, not a
model: after job 1 it answers the check malformed, is asked again and answers CONTINUE; after job 2
it answers SWITCH (algorithm -> grpo) and its next job is GRPO; after job 3 it answers twice
without a decide call and the check is logged as MALFORMED. The jobs, the dev scores, the rule
evaluator, the intervention, the ledger and MLflow are the real ones.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from mlflow import MlflowClient

from agent_trainer.config import compose_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scripted_backend", ROOT / "tests" / "fixtures" / "scripted_backend.py")
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)
ScriptedBackend, call = scripted.ScriptedBackend, scripted.call
TASK = str(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
SFT = "base_model: tiny-s\nalgorithm: sft\nhyperparameters: {{learning_rate: 3.0e-3, batch_size: 32, max_steps: {steps}}}\n" \
      "data: {{sources: [{{family: calc_chain, seed: 1, size: 400}}]}}\n"
GRPO = "base_model: tiny-s\nalgorithm: grpo\nreward: {functions: [{name: numeric_closeness}, {name: exact_match}]}\n" \
       "hyperparameters: {learning_rate: 5.0e-4, batch_size: 16, num_generations: 4, max_steps: 8}\n" \
       "data: {sources: [{family: calc_chain, seed: 2, size: 200}]}\n"
NUDGE = "Write down what you learned before the next job."


def shown_scores(messages) -> list[float]:
    """The dev scores the last check message shows (what a careful agent copies into decide)."""
    check = next(m["content"] for m in reversed(messages) if m["role"] == "user" and "Check after job" in m["content"])
    listed = check.split("Dev scores", 1)[1].split("Answer now", 1)[0]
    return [float(x) for x in re.findall(r"job \d+: (\d\.\d{3})", listed)]


def decide(decision, **extra):
    return lambda msgs: [call("decide", strategy="sft on curated calc_chain items", scores=shown_scores(msgs),
                              decision=decision, **extra)]


SCRIPT = [
    [call("write_file", path="job.yaml", content=SFT.format(steps=10))],
    [call("submit_job", path="job.yaml")],
    decide("MAYBE", reason="not sure what to do next here"),                         # malformed: asked again
    decide("CONTINUE", reason="the loss still falls, so more steps should help"),
    [call("write_file", path="job.yaml", content=SFT.format(steps=20))],
    [call("submit_job", path="job.yaml")],
    decide("SWITCH", component="algorithm", alternative="grpo",
           reason="two sft jobs barely moved the dev score; a reward with partial credit may"),
    [call("write_file", path="job.yaml", content=GRPO)],
    [call("submit_job", path="job.yaml")],
    "I think the job went fine.",                                                    # no tool call: asked again
    [call("write_file", path="job.yaml", content="base_model: tiny-m\n")],            # not decide: MALFORMED
    [call("submit_job", path="job.yaml")],
]


@pytest.fixture(scope="module")
def run(tmp_path_factory, built_models):
    from agent_trainer.commands import episode as at_episode

    tmp = tmp_path_factory.mktemp("check")
    backend = ScriptedBackend(SCRIPT)
    cfg = compose_config([f"runs_dir={tmp}", "run_id=check", f"task.spec_path={TASK}", "strategy=check",
                          "strategy.evaluator.kind=rule", "strategy.dev_size=32", "inner=fast",
                          f"strategy.interventions=[{{after_job: 3, message: '{NUDGE}'}}]",
                          "budget.max_jobs_per_episode=4", "agent.max_turns=20", "hardware.threads_per_job=1"],
                         "episode")
    mp = pytest.MonkeyPatch()
    mp.setattr(at_episode, "make_agent_backend", lambda cfg: backend)
    try:
        reward = at_episode.run(cfg)
    finally:
        mp.undo()
    ep = tmp / "check" / "episodes" / "0"
    events = [json.loads(x) for x in (ep / "trajectory.jsonl").read_text().splitlines()]
    return {"dir": tmp / "check", "ep": ep, "events": events, "summary": json.loads((ep / "summary.json").read_text()),
            "backend": backend, "cfg": cfg, "reward": reward}


def of(events, kind):
    return [e for e in events if e.get("event") == kind]


def test_decisions_and_their_outcomes_are_logged(run):
    ev = run["events"]
    jobs = of(ev, "job")
    assert [j["status"] for j in jobs] == ["ok"] * 4, "four real jobs ran"
    decisions = of(ev, "decision")
    assert [d["decision"] for d in decisions] == ["CONTINUE", "SWITCH", "MALFORMED"]
    assert [d["after_job"] for d in decisions] == [1, 2, 3]
    cont, switch, bad = decisions
    assert cont["attempts"] == 2 and "decision must be CONTINUE or SWITCH" in cont["problems"][0]
    assert switch["attempts"] == 1 and (switch["component"], switch["alternative"]) == ("algorithm", "grpo")
    assert bad["attempts"] == 2 and bad["problems"] == ["no tool call", "called write_file instead of decide"]
    outcomes = {o["after_job"]: o for o in of(ev, "decision_outcome")}
    assert outcomes[1]["switched"] is False and outcomes[1]["followed"] is True        # CONTINUE kept sft
    assert outcomes[2]["switched"] is True and outcomes[2]["components"] == ["p"] and outcomes[2]["followed"] is True
    assert outcomes[3]["switched"] is False and outcomes[3]["followed"] is None
    for o in outcomes.values():   # dev_rose compares the dev scores the harness logged
        dev = {j["job"]: j["dev_score"] for j in of(ev, "strategy_job")}
        assert o["dev_rose"] == (dev[o["next_job"]] > dev[o["next_job"] - 1])


def test_the_agent_saw_the_check_and_malformed_answers_were_not_run(run):
    ev = run["events"]
    checks = of(ev, "check")
    assert [c["after_job"] for c in checks] == [1, 2, 3], "no check after the last job"
    msgs = [e for e in ev if e.get("event") == "message"]
    check_texts = [m["content"] for m in msgs if m["role"] == "user" and "Check after job" in m["content"]]
    assert len(check_texts) == 3 and "decide(" in check_texts[0]
    assert sum("malformed" in m["content"] for m in msgs if m["role"] == "user") == 3  # 2 re-asks + 1 logged
    # the write_file sent instead of decide was not run: the last job is still the GRPO one
    not_run = [m for m in msgs if m["role"] == "tool" and m["content"].startswith("not run")]
    assert len(not_run) == 1 and not_run[0]["name"] == "write_file"
    assert (run["ep"] / "jobs" / "03" / "job" / "job.yaml").read_text() == GRPO
    # the dev scores shown match those logged for the jobs
    dev = [j["dev_score"] for j in of(ev, "strategy_job")]
    assert all(isinstance(x, float) for x in dev)
    assert f"job 2: {dev[1]:.3f}" in check_texts[1]
    # the intervention came after job 3's result, before its check
    i_iv = next(i for i, m in enumerate(msgs) if m.get("content") == NUDGE)
    i_check3 = next(i for i, m in enumerate(msgs) if "Check after job 3" in (m.get("content") or ""))
    i_job3 = [i for i, m in enumerate(msgs) if m["role"] == "tool" and m["content"].startswith("job status")][2]
    assert i_job3 < i_iv < i_check3
    system = run["backend"].seen[0][0]["content"]   # the tiny agent's style: tools listed in the system prompt
    assert "decide(strategy, scores, decision, component, alternative, reason)" in system
    assert "journal_write" not in system and "list_skills" not in system   # not enabled here


def test_labels_switches_adoption_in_summary_and_mlflow(run):
    s = run["summary"]["strategy"]
    assert run["summary"]["reward"]["post_score"] == s["jobs"][-1]["hidden_score"]   # episode_reward: last
    assert s["sequence"] == ["full_sft/curated/single"] * 2 + ["rl/curated/single"] * 2
    assert (s["pairs"], s["switches"], s["first_switch"], s["switch_p"]) == (3, 1, 3, 1)
    m = s["steering"]["metrics"]
    assert (m["decisions"], m["decisions_continue"], m["decisions_switch"], m["decisions_malformed"]) == (3, 1, 1, 1)
    assert m["decisions_reasked"] == 2 and m["switch_followed_rate"] == 1.0 and m["continue_kept_rate"] == 1.0
    # the rule evaluator's max_steps suggestion after job 1 (10 of 100 steps) was carried out by job 2 (20 steps)
    adoptions = s["steering"]["adoptions"]
    first = [a for a in adoptions if a["after_job"] == 1 and a["target"] == "max_steps"]
    assert first and first[0]["adopted"] is True and first[0]["type"] == "execution"
    for a in adoptions:
        if a["target"] == "algorithm":   # adopted exactly when the next job ran that algorithm
            assert a["adopted"] == (a["value"] == ("grpo" if a["next_job"] >= 3 else "sft"))
    for t in ("execution", "strategy"):
        rows = [a for a in adoptions if a["type"] == t]
        if rows:
            assert m[f"adoption_{t}"] == pytest.approx(sum(a["adopted"] for a in rows) / len(rows))
    client = MlflowClient(tracking_uri=str(run["cfg"].tracking.tracking_uri))
    exp = client.get_experiment_by_name(str(run["cfg"].tracking.experiment))
    (r,) = client.search_runs([exp.experiment_id], "tags.command = 'at-episode'")
    logged = r.data.metrics
    assert logged["switch_rate"] == pytest.approx(1 / 3) and logged["decisions_malformed"] == 1.0
    assert logged["first_switch"] == 3.0 and logged["reward_total"] == pytest.approx(run["reward"])
    hist = client.get_metric_history(r.info.run_id, "job_hidden_score")
    assert sorted(h.step for h in hist) == [1, 2, 3, 4]
    # the ledger charged every agent turn, the re-asked ones too
    records = [json.loads(x) for x in (run["dir"] / "ledger.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "llm" for r in records) == len(run["backend"].seen)
    assert sum(r["kind"] == "job" for r in records) == 4
