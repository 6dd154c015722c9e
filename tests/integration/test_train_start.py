"""What ``at-train`` checks before it trains: every family's task spec (a user's family from its card on
``task.include_path``), held-out families that would never be evaluated, and a user error found after start-up,
which leaves neither a run folder nor an MLflow run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_trainer.cli import UserError
from agent_trainer.commands import train as at_train
from agent_trainer.config import compose_config

BIN = Path(sys.executable).parent


def family_folder(tmp_path: Path, rows: str | None = None) -> Path:
    """A folder with the card and rows of a data family ``sums`` (no task spec anywhere)."""
    fams = tmp_path / "fams"
    fams.mkdir()
    data = rows if rows is not None else "".join(
        json.dumps({"prompt": f"sum: {a}+{b} =", "answer": str(a + b)}) + "\n" for a in range(30) for b in range(30))
    (fams / "sums.jsonl").write_text(data)
    (fams / "sums.yaml").write_text(yaml.safe_dump({"name": "sums", "scorer": "numeric", "max_new_tokens": 4,
                                                    "instruction": "Add two numbers.", "data": "sums.jsonl"}))
    return fams


def test_a_family_on_the_include_path_trains_and_is_held_out_with_a_spec_from_its_card(tmp_path, capsys):
    fams = family_folder(tmp_path)
    base = ["experiment=smoke", f"runs_dir={tmp_path / 'runs'}", "dry_run=true", f"task.include_path=[{fams}]"]
    at_train.run(compose_config([*base, "run_id=a", "task.train_families=[calc_chain,sums]"], "train"))
    specs = tmp_path / "runs" / "a" / "task_specs"
    made = json.loads((specs / "sums.json").read_text())
    builtin = json.loads((specs / "calc_chain.json").read_text())   # the smoke pattern's own spec, as it is
    assert made["name"] == "sums_v1_tiny" and made["family"] == "sums"
    assert made["budget"] == builtin["budget"] and made["allowed_base_models"] == builtin["allowed_base_models"]
    assert made["hidden_eval_size"] <= 900 // 4   # capped at the card's hidden rows (about 1 in 8)
    # as a held-out family; listed where no evaluation runs (smoke: heldout_every 0), at-train warns
    at_train.run(compose_config([*base, "run_id=b", "task.held_out_families=[sums]"], "train"))
    assert (tmp_path / "runs" / "b" / "task_specs" / "sums.json").is_file()
    assert "task.held_out_families=['sums'] are never evaluated" in capsys.readouterr().err


def test_a_dry_run_names_every_family_without_a_spec(tmp_path):
    cfg = compose_config(["experiment=smoke", f"runs_dir={tmp_path}", "dry_run=true",
                          "task.train_families=[calc_chain,sums]", "task.held_out_families=[nope]"], "train")
    with pytest.raises(UserError, match=r"families sums, nope: task.spec_pattern=.* task.include_path \(empty\)"):
        at_train.run(cfg)


def test_a_user_error_after_start_up_leaves_no_folder_and_no_mlflow_run(tmp_path):
    fams = family_folder(tmp_path, rows='{"prompt": "sum: 1+1 =", "answer": "2"}\n{"prompt": broken\n')
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    out = subprocess.run([str(BIN / "at-train"), "experiment=smoke", "task.train_families=[sums]",
                          f"task.include_path=[{fams}]", f"runs_dir={tmp_path / 'runs'}", "run_id=bad"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and "sums.jsonl" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs" / "bad").exists()
    db = tmp_path / "runs" / "mlflow.db"
    if db.exists():
        import mlflow

        assert mlflow.MlflowClient(f"sqlite:///{db}").search_runs(
            [e.experiment_id for e in mlflow.MlflowClient(f"sqlite:///{db}").search_experiments()]) == []


def test_a_family_without_room_for_its_answers_stops_at_train_before_any_step(tmp_path):
    """Every job of a family whose answers are longer (in a base model's tokens) than its ``max_new_tokens`` would
    train and then score 0: at-train refuses it at start, naming the family, the answer and the model."""
    fams = tmp_path / "fams"
    fams.mkdir()
    (fams / "mood.jsonl").write_text("".join(json.dumps({"prompt": f"Day {i} was {'bad' if i % 2 else 'good'}.",
                                                         "answer": "negative" if i % 2 else "positive"}) + "\n"
                                             for i in range(400)))
    (fams / "mood.yaml").write_text(yaml.safe_dump({"name": "mood", "scorer": "label", "max_new_tokens": 4}))
    cfg = compose_config(["experiment=smoke", f"runs_dir={tmp_path / 'runs'}", "tracking=off", "run_id=m",
                          f"task.include_path=[{fams}]", "task.train_families=[calc_chain,mood]"], "train")
    with pytest.raises(UserError, match=r"family mood: its answer 'negative' takes 6 tokens of tiny-s's tokenizer"):
        at_train.run(cfg)
    assert not (tmp_path / "runs" / "m" / "metrics.jsonl").exists()
