"""``agent.submit_at_turn_limit``: an episode that runs out of turns without submitting has the job validate_job
last called VALID submitted by the harness, when that job is unchanged since; a ``finish`` without a job, a job
edited after its VALID verdict, or the setting off leave the episode without a job, as before.

The agent is scripted (what is tested is the harness's rule); validation and the job run are real."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agent_trainer.config import AgentConfig, BudgetConfig
from agent_trainer.evaluation.tasks import load_task
from agent_trainer.inner_loop.run.request import JobSettings
from agent_trainer.outer_loop.episode.episode import Episode, EpisodeSettings, play_all
from agent_trainer.outer_loop.rl.metrics import step_metrics

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scripted_backend", ROOT / "tests" / "fixtures" / "scripted_backend.py")
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)
call = scripted.call
TASK = load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
GOOD = ("base_model: tiny-s\nalgorithm: sft\nhyperparameters: {learning_rate: 1.0e-3, batch_size: 8, max_steps: 2}\n"
        "data: {sources: [{family: calc_chain, seed: 1, size: 32}]}\nseed: 0\n")
BROKEN = GOOD.replace("learning_rate", "learning_rte")


def _episode(tmp_path, turns, *, on=True, defer=True, max_turns=4):
    settings = EpisodeSettings(AgentConfig(max_turns=max_turns, submit_at_turn_limit=on),
                               BudgetConfig(max_jobs_per_episode=1))
    return Episode(scripted.ScriptedBackend(turns), TASK, tmp_path / "ep", settings=settings, defer_jobs=defer,
                   job_settings=JobSettings(dry_run=False, cache=False, progress=False, hidden_n=16))


def _events(ep, name):
    import json

    return [r for r in map(json.loads, (ep.dir / "trajectory.jsonl").read_text().splitlines())
            if r.get("event") == name]


# the write-and-validate loop a policy fell into (docs/results/2026-12-05-smollm2-v4-validation-without-job.md):
# valid, never submitted
LOOP = [[call("write_file", path="job.yaml", content=GOOD)], [call("validate_job", path="job.yaml")],
        [call("write_file", path="job.yaml")], [call("validate_job", path="job.yaml")]]


def test_out_of_turns_the_last_valid_job_is_submitted_and_runs(tmp_path):
    ep = _episode(tmp_path, LOOP)
    play_all([ep], lambda eps: None)
    assert ep.status == "max_turns" and len(ep.pending) == 1   # deferred: the caller runs it, as an episode's last
    snapshot = ep.pending[0].job_dir
    assert (snapshot / "job.yaml").read_text() == GOOD
    (event,) = _events(ep, "harness_submit")
    assert event["ok"] and event["path"] == "."
    ep.run_pending()
    result = ep.finish()
    assert result.harness_submitted == 1 and result.status == "max_turns"
    assert [j["status"] for j in result.jobs] == ["ok"] and result.reward["job_success"] == 1.0
    m = step_metrics([result], {}, {}, None)
    assert m["harness_submitted_rate"] == 1.0 and m["submitted_rate"] == 0.0   # not the agent's own submission
    assert m["valid_rate"] == 1.0 and m["refused_calls_mean"] == 1.0   # the write without content


def test_in_turn_episodes_run_it_at_once(tmp_path):
    ep = _episode(tmp_path, LOOP, defer=False)
    assert ep.play() == "max_turns" and not ep.pending
    assert [r.status for r in ep.box.state.jobs] == ["ok"] and ep.finish().harness_submitted == 1


LIST = [call("list_files")]


@pytest.mark.parametrize("case", ["setting_off", "edited_after_valid", "finished", "never_valid", "agent_submitted"])
def test_nothing_is_submitted_for_the_agent_otherwise(tmp_path, case):
    turns = {
        "setting_off": LOOP,
        "edited_after_valid": LOOP[:2] + [[call("write_file", path="job.yaml", content=GOOD + "# more\n")], LIST],
        "finished": LOOP[:2] + [[call("finish", summary="stop here")]],
        "never_valid": [[call("write_file", path="job.yaml", content=BROKEN)], [call("validate_job", path=".")],
                        LIST, LIST],
        "agent_submitted": LOOP[:1] + [[call("submit_job", path="job.yaml")]],
    }[case]
    ep = _episode(tmp_path, turns, on=case != "setting_off")
    play_all([ep], lambda eps: None)
    assert not _events(ep, "harness_submit") and ep.box.state.harness_submitted == 0
    assert len(ep.pending) == (1 if case == "agent_submitted" else 0)
    assert ep.status == {"finished": "finished", "agent_submitted": "max_jobs"}.get(case, "max_turns")
    ep.finish()


def test_refused_calls_are_counted_apart_from_verdicts(tmp_path):
    turns = [[call("write_file", path="job.yaml")],                         # no content: refused
             [call("read_file", path="../outside.txt")],                    # outside the workspace: refused
             [call("write_file", path="job.yaml", content=BROKEN)],
             [call("validate_job", path="job.yaml")]]                       # INVALID: a verdict, not a refusal
    ep = _episode(tmp_path, turns, on=False)
    assert ep.play() == "max_turns"
    result = ep.finish()
    assert result.refused_calls == 2 and result.reward["validation"] == 0.0
    m = step_metrics([result], {}, {}, None)
    assert m["refused_calls_mean"] == 2.0 and m["valid_rate"] == 0.0
