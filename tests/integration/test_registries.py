"""Base models and task families added by configuration alone, from a user's folder, through the real commands.

A copy of tiny-s in a temporary folder becomes ``my-model`` (``+base_models.my-model.path=...``), a
YAML card with a JSONL there becomes the family ``my_rows`` (``task.include_path=[...]``); nothing in
the package is edited. ``at-eval`` scores the one on the other and ``at-job`` trains the one on the other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_trainer.registry import Registry, UnknownName

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def test_a_registry_lists_the_known_names_in_one_error_style():
    reg = Registry("widget", hint="add one with widgets.<name>")
    reg.register("b", 2)
    reg.register("a", 1)
    assert reg["a"] == 1 and "a" in reg and list(reg) == ["b", "a"] and reg.get("z") is None
    with pytest.raises(UnknownName, match=r"unknown widget 'z'; known: a, b; add one with widgets.<name>"):
        reg["z"]
    with pytest.raises(UnknownName, match="registered already"):
        reg.register("a", 3)
    state = {"key": 0}
    reg.add_loader(lambda: state["key"], lambda r, k: r.register(f"loaded{k}", k, replace=True))
    assert "loaded0" in reg
    state["key"] = 1
    assert "loaded1" in reg


def _user_folder(tmp_path: Path, tiny_s: Path) -> tuple[Path, Path, Path]:
    """A model folder, a family folder (card + rows) and a task spec, as a user would write them."""
    model = shutil.copytree(tiny_s, tmp_path / "models" / "my-model")
    fams = tmp_path / "families"
    fams.mkdir()
    rows = [{"prompt": f"add: {a}+{b}=", "answer": str(a + b)} for a in range(40) for b in range(40)]
    (fams / "my_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (fams / "my_rows.yaml").write_text(yaml.safe_dump({"name": "my_rows", "scorer": "numeric", "max_new_tokens": 4,
                                                        "instruction": "Add two numbers.", "data": "my_rows.jsonl"}))
    spec = tmp_path / "my_task.json"
    spec.write_text(json.dumps({"name": "my_task", "family": "my_rows", "allowed_base_models": ["my-model"],
                                "hidden_eval_size": 40,
                                "budget": {"max_steps": 60, "max_seconds": 90, "max_usd": 0.05}}))
    return model, fams, spec


def at(command: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "AGENT_TRAINER_INCLUDE_PATH",
                                                            "AGENT_TRAINER_BASE_MODELS")}
    return subprocess.run([str(BIN / command), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_configured_model_and_data_family_work_in_at_eval_and_at_job(built_models, tmp_path):
    model, fams, spec = _user_folder(tmp_path, Path(built_models["tiny-s"]))
    config = [f"runs_dir={tmp_path / 'runs'}", "tracking=off", f"task={spec}", f"task.include_path=[{fams}]",
              f"+base_models.my-model.path={model}", "+base_models.my-model.stands_for=a copy of tiny-s",
              "+base_models.my-model.cost_factor=1.0"]
    ev = at("at-eval", "model=my-model", "run_id=eval", *config)
    assert ev.returncode == 0, ev.stderr[-2000:]
    scored = json.loads((tmp_path / "runs" / "eval" / "eval.json").read_text())
    assert scored["family"] == "my_rows" and scored["n"] == 40 and 0.0 <= scored["hidden_score"] <= 1.0

    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "my-model", "algorithm": "sft", "seed": 0,
        "hyperparameters": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 5},
        "data": {"sources": [{"family": "my_rows", "seed": 1, "size": 200}]}}))
    run = at("at-job", str(job), "run_id=job", "inner.cache=false", *config)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads((tmp_path / "runs" / "job" / "job" / "result.json").read_text())
    assert result["status"] == "ok" and result["base_model"] == "my-model", result["detail"]
    assert result["baseline"] == pytest.approx(scored["baseline"]) and result["hidden_score"] is not None
    assert result["flagged"] is False


@pytest.mark.parametrize("args, text", [
    (["+base_models.my-model.pth=/x"], "unknown key(s) ['pth']"),
    (["+base_models.tiny-s.path=/tmp"], "built-in model"),
    (["task.include_path=[/nonexistent/families]"], "/nonexistent/families is not a folder"),
], ids=["typo_in_entry", "built_in_name", "missing_include_folder"])
def test_bad_registry_configuration_is_one_line(tmp_path, args, text):
    proc = at("at-eval", f"runs_dir={tmp_path}", "tracking=off", *args)
    assert proc.returncode == 2 and text in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
