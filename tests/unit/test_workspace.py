"""Workspace and tools: what the agent sees, path confinement, argument checking, limits, real validation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent_trainer.evaluation.tasks import load_task, parse_task
from agent_trainer.config import BudgetConfig
from agent_trainer.outer_loop.episode.ledger import Ledger
from agent_trainer.outer_loop.episode.tools import SCHEMAS, ToolBox, ToolLimits, check_arguments
from agent_trainer.outer_loop.episode.workspace import GUIDE_FILE, TASK_FILE, Workspace, WorkspaceError
from agent_trainer.inner_loop.run.request import JobSettings
from agent_trainer.inner_loop.spec.validate import validate_job

ROOT = Path(__file__).resolve().parents[2]

VALID_JOB = """base_model: tiny-s
algorithm: sft
hyperparameters: {learning_rate: 1.0e-3, batch_size: 16, max_steps: 5}
data:
  sources: [{family: calc_chain, seed: 1, size: 64}]
seed: 0
"""
INVALID_JOB = VALID_JOB.replace("algorithm: sft", "algorithm: grpo")  # grpo without a reward


@pytest.fixture
def task():
    return parse_task({"name": "calc_chain_test", "family": "calc_chain", "hidden_eval_size": 50,
                       "budget": {"max_steps": 20, "max_seconds": 30, "max_usd": 0.05}})


@pytest.fixture
def ws(tmp_path, task):
    return Workspace.create(tmp_path / "episode" / "workspace", task, max_file_bytes=2000, max_total_bytes=20_000)


@pytest.fixture
def box(ws, task, tmp_path):
    return ToolBox(ws, task, limits=ToolLimits(max_turns=3, max_jobs_per_episode=2, max_read_chars=100),
                   jobs_dir=tmp_path / "episode" / "jobs", validate_kwargs={"dry_run": False},
                   job_settings=JobSettings(dry_run=False, progress=False, cache=False))


def test_workspace_holds_the_visible_task_and_a_generated_guide(ws):
    assert sorted(p.name for p in ws.root.iterdir()) == [GUIDE_FILE, TASK_FILE]
    seen = json.loads((ws.root / TASK_FILE).read_text())
    assert seen["family"] == "calc_chain" and seen["allowed_base_models"] == ["tiny-s", "tiny-m"]
    assert "hidden_eval_size" not in seen and "held_out" not in seen
    assert "held_out" not in seen["family_info"] and seen["family_info"]["example"]["prompt"]
    guide = (ws.root / GUIDE_FILE).read_text()
    for needle in ("lookup_baseline", "validate_job", "submit_job", "finish", "num_generations",
                   "GRPO completions per prompt", "learning_rate", "numeric_closeness", "grpo | sft"):
        assert needle in guide, needle


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../b", "~/x", "", "a\\b"])
def test_paths_outside_the_workspace_are_refused(ws, path):
    with pytest.raises(WorkspaceError):
        ws.write(path, "x")
    with pytest.raises(WorkspaceError):
        ws.read(path)


def test_symlinks_leaving_the_workspace_are_refused(ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hidden")
    os.symlink(secret, ws.root / "link.txt")
    os.symlink(tmp_path, ws.root / "outdir")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        ws.read("link.txt")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        ws.write("outdir/new.txt", "x")
    assert not (tmp_path / "new.txt").exists()
    (ws.root / "sub").mkdir()
    os.symlink(ws.root / "sub", ws.root / "inner")
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.write("inner/f.txt", "x")


def test_size_limits(ws):
    with pytest.raises(WorkspaceError, match="file limit"):
        ws.write("big.txt", "x" * 2001)
    for i in range((20_000 - ws.total_bytes()) // 1900):  # GUIDE.md and task.json count too
        ws.write(f"f{i}.txt", "x" * 1900)
    with pytest.raises(WorkspaceError, match="workspace would exceed"):
        ws.write("one_more.txt", "x" * 1900)


def test_toolbox_never_raises_on_bad_calls(box):
    cases = [
        ("nope", "{}", "unknown tool 'nope'"),
        ("read_file", {}, "missing required argument(s) path"),
        ("read_file", {"path": 5}, "must be of type string"),
        ("read_file", {"path": "task.json", "offset": True}, "must be of type integer"),
        ("read_file", {"path": "task.json", "mode": "r"}, "unknown argument(s) mode"),
        ("read_file", '{"path": "task.json"', "not valid JSON"),
        ("read_file", "[1, 2]", "must be a JSON object"),
        ("read_file", {"path": "../x"}, "leaves the workspace"),
        ("read_file", {"path": "missing.txt"}, "does not exist"),
        ("write_file", {"path": ".", "content": "x"}, "is a folder"),
        ("validate_job", {}, "no job.yaml"),
    ]
    for name, args, needle in cases:
        res = box.call(name, args)
        assert not res.ok and needle in res.text, (name, args, res.text)


def test_files_round_trip_with_pages(box):
    assert box.call("write_file", '{"path": "notes/a.txt", "content": "' + "ab" * 80 + '"}').ok
    first = box.call("read_file", {"path": "notes/a.txt"})
    assert first.ok and first.text.startswith("ab" * 50) and "offset 100" in first.text
    assert box.call("read_file", {"path": "notes/a.txt", "offset": 100}).text == "ab" * 30
    listing = box.call("list_files", {}).text
    assert "notes/" in listing and "notes/a.txt  (160 bytes)" in listing


def test_validate_then_submit_counts_retries_and_hides_results(box, task, tmp_path):
    box.call("write_file", {"path": "job.yaml", "content": INVALID_JOB})
    bad = box.call("validate_job", {})
    assert not bad.ok and "INVALID" in bad.text and "reward" in bad.text
    assert str(box.ws.root) not in bad.text  # the agent sees workspace-relative paths
    box.call("write_file", {"path": "job.yaml", "content": VALID_JOB})
    good = box.call("validate_job", {"path": "job.yaml"})
    assert good.ok and "VALID" in good.text
    assert box.state.validation_failures() == 1
    # A real inner job that the probe refuses: fast, and it exercises the whole submit path.
    box.call("write_file", {"path": "job.yaml", "content": INVALID_JOB})
    res = box.call("submit_job", {})
    assert not res.ok and res.data["status"] == "invalid" and "job status: invalid" in res.text
    assert "hidden_score" not in res.data and "baseline" not in res.data
    assert (box.jobs_dir / "00" / "job" / "job.yaml").read_text() == INVALID_JOB
    assert not list(box.ws.root.rglob("result.json"))  # the harness's file is outside the workspace
    assert box.state.jobs[0].status == "invalid" and box.state.validations == [False, True, False]
    outcome = box.state.outcome(task)
    assert outcome.status == "invalid" and outcome.budget_seconds == 30


def test_a_job_submitted_unchanged_after_an_invalid_validation_is_counted(ws, task, tmp_path):
    """The habit the SmolLM2 agent learned (docs/results/2026-12-04-smollm2-recipe-first-seeds.md): validate, read
    INVALID, submit the same file."""
    box = ToolBox(ws, task, limits=ToolLimits(max_turns=9, max_jobs_per_episode=3), jobs_dir=tmp_path / "jobs",
                  validate_kwargs={"dry_run": False}, defer_jobs=True,
                  job_settings=JobSettings(dry_run=False, progress=False, cache=False))
    box.call("write_file", {"path": "job.yaml", "content": INVALID_JOB})
    assert not box.call("validate_job", {}).ok
    assert box.call("submit_job", {}).ok and box.state.submitted_unfixed == 1     # unchanged: counted
    box.call("write_file", {"path": "job.yaml", "content": INVALID_JOB + "# edited\n"})
    assert box.call("submit_job", {}).ok and box.state.submitted_unfixed == 1     # changed since: not counted
    box.call("write_file", {"path": "job.yaml", "content": VALID_JOB})
    assert box.call("validate_job", {}).ok
    assert box.call("submit_job", {}).ok and box.state.submitted_unfixed == 1     # valid: not counted


def test_limits_and_budget(box, tmp_path):
    box.call("write_file", {"path": "job.yaml", "content": VALID_JOB})
    box.limits.max_jobs_per_episode = 0
    assert "job limit reached" in box.call("submit_job", {}).text
    box.limits.max_jobs_per_episode = 2
    box.ledger = Ledger.open(tmp_path / "run", budget=BudgetConfig(max_jobs_per_episode=0))
    res = box.call("submit_job", {})
    assert not res.ok and "not submitted" in res.text and "budget.max_jobs_per_episode" in res.text
    assert not box.state.jobs
    assert [box.next_turn() for _ in range(4)] == [True, True, True, False] and box.done
    assert box.call("finish", {"summary": "done"}).ok and box.state.finished
    assert "finished" in box.call("list_files", {}).text


def test_unknown_base_model_and_unsafe_jobs_dir(box, ws, task):
    res = box.call("lookup_baseline", {"model": "gpt-99"})
    assert not res.ok and "tiny-s, tiny-m" in res.text
    with pytest.raises(ValueError, match="inside the workspace"):
        ToolBox(ws, task, limits=ToolLimits(max_turns=3, max_jobs_per_episode=1), jobs_dir=ws.root / "jobs")


def test_schemas_are_openai_functions():
    for s in SCHEMAS:
        fn = s["function"]
        assert s["type"] == "function" and fn["description"] and fn["parameters"]["type"] == "object"
        assert check_arguments(s, {k: "x" for k in fn["parameters"]["required"]
                                   if fn["parameters"]["properties"][k]["type"] == "string"})[0] is not None


@pytest.mark.parametrize("price, verdict", [(None, True), (3.5, False)])
def test_validate_job_prices_a_job_as_submit_job_will(tmp_path, price, verdict):
    """The agent's validate_job takes the jobs' own settings: with a GPU's price (hardware=gpu: $3.50 an hour) a job
    VALID at the CPU's $0.10 is over this task's dollar budget in the validation, as it is at submission."""
    task = load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
    ws = Workspace.create(tmp_path / "episode" / "workspace", task)
    ws.write("job.yaml", (ROOT / "examples/jobs/grpo_lora/job.yaml").read_text())
    settings = JobSettings(dry_run=False, progress=False, cache=False, price_per_hour=price)
    box = ToolBox(ws, task, limits=ToolLimits(max_turns=3, max_jobs_per_episode=1),
                  jobs_dir=tmp_path / "episode" / "jobs", validate_kwargs={"dry_run": False}, job_settings=settings)
    result = box.call("validate_job", {"path": "job.yaml"})
    assert result.ok is verdict, result.text
    submitted = validate_job(ws.root, task, dry_run=False, cost_model=settings.cost())
    assert result.data["estimated_cost"] == submitted.to_dict()["estimated_cost"]
    assert ("is over the task's $0.01 budget" in result.text) is not verdict, result.text
