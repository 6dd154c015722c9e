"""Tracking writes to a real MLflow SQLite store; everything is read back with MlflowClient."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from agent_trainer.config import compose_config
from agent_trainer.tracking import (
    Tracker, TrackingError, check_tracking_uri, flatten, is_secret_key, read_metrics, safe_params,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def cfg(runs):
    # agent=openai so api_key_env holds a value that must not reach MLflow
    return compose_config([f"runs_dir={runs}", "agent=openai", "tracking.experiment=unit"])


def test_flatten_nested_config_to_dotted_keys():
    flat = flatten({"outer": {"lr": 1e-4, "lora": {"r": 16}}, "families": ["a", "b"], "rows": [{"x": 1}], "none": None})
    assert flat == {"outer.lr": 1e-4, "outer.lora.r": 16, "families": '["a", "b"]', "rows.0.x": 1, "none": None}


@pytest.mark.parametrize("key", ["agent.api_key_env", "api_key", "hf_token", "db.password", "client_secret",
                                 "AWS_ACCESS_KEY", "x.apikey", "private-key"])
def test_secret_keys_are_recognised(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["agent.max_new_tokens", "budget.max_tokens_per_run", "tokenizer", "keys", "monkey"])
def test_ordinary_keys_are_not_secrets(key):
    assert not is_secret_key(key)


def test_secret_values_are_dropped_and_long_values_truncated():
    out = safe_params({"a": "sk-proj-0123456789abcdefghij", "b": "x" * 7000, "c": None})
    assert "a" not in out and len(out["b"]) == 6000 and out["c"] == "None"


def test_params_metrics_children_artifacts_read_back(cfg, runs, tmp_path):
    uri = cfg.tracking.tracking_uri
    metrics = {f"loss/{i}": i / 10 for i in range(1200)}  # more than one log_batch call (1000)
    note = tmp_path / "note.txt"
    note.write_text("hello")
    with Tracker.from_config(cfg, run_name="parent", tags={"command": "test"}) as tr:
        logged = tr.log_config(cfg)
        tr.log_metrics(metrics, step=2)
        tr.log_metrics({"reward": 0.5, "skipped": None}, step=3)
        tr.set_tags({"phase": "unit", "hf_token": "hf_abcdefghijklmnopq"})
        with tr.child("episode-0") as child:
            child.log_metrics({"reward": 1.0}, step=0)
            child.log_artifact(note, "notes")
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(tr.run_id)
    params = run.data.params
    assert params["outer.lr"] == str(cfg.outer.lr) == "0.002" and params["agent.backend"] == "openai"
    assert params["agent.model"] == cfg.agent.model and params == logged
    assert not any("api_key" in k for k in params), "the name of the key variable must not be logged"
    assert len(run.data.metrics) == 1201 and run.data.metrics["loss/1199"] == pytest.approx(119.9)
    assert read_metrics(uri, tr.run_id, ["reward"]) == {"reward": [(3, 0.5)]}
    assert run.data.tags["phase"] == "unit" and "hf_token" not in run.data.tags
    assert run.info.status == "FINISHED"
    kid = client.get_run(child.run_id)
    assert kid.data.tags["mlflow.parentRunId"] == tr.run_id
    # artifacts land in the runs folder, not in ./mlruns of the working directory
    assert kid.info.artifact_uri.startswith((runs / "mlartifacts").resolve().as_uri())
    assert [a.path for a in client.list_artifacts(child.run_id, "notes")] == ["notes/note.txt"]
    assert (Path(uri[len("sqlite:///"):])).parent == runs.resolve()


def test_failed_block_marks_the_run_failed(cfg):
    with pytest.raises(RuntimeError):
        with Tracker.from_config(cfg, run_name="boom") as tr:
            raise RuntimeError("boom")
    assert MlflowClient(tracking_uri=cfg.tracking.tracking_uri).get_run(tr.run_id).info.status == "FAILED"


def test_logging_before_start_says_what_to_do(cfg):
    with pytest.raises(TrackingError, match="not started"):
        Tracker.from_config(cfg).log_metrics({"x": 1.0})
    with pytest.raises(TrackingError, match="must be a number"):
        with Tracker.from_config(cfg) as tr:
            tr.log_metrics({"x": "high"})


def test_unreachable_server_fails_fast_with_the_fix():
    t0 = time.monotonic()
    with pytest.raises(TrackingError, match=r"http://127\.0\.0\.1:9.*did not answer.*tracking=server"):
        Tracker("http://127.0.0.1:9", connect_timeout_s=2).start()
    assert time.monotonic() - t0 < 5


def test_file_store_uri_is_refused():
    with pytest.raises(TrackingError, match="sqlite"):
        check_tracking_uri("./mlruns")


def test_disabled_tracker_logs_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with Tracker(uri, enabled=False) as tr:
        tr.log_config({"a": 1})
        tr.log_metrics({"x": 1.0}, step=1)
        with tr.child("c") as c:
            c.log_artifact(tmp_path / "missing")
    assert tr.run_id is None and not (tmp_path / "mlflow.db").exists()


def test_a_job_choice_of_any_shape_gives_metric_names_mlflow_accepts(tmp_path):
    """An agent may write anything as base_model (seed 1 wrote {'r': 16, 'alpha': 2}): its share is logged under
    ``other``, and no metric name ever ends the run."""
    from agent_trainer.outer_loop.episode.episode import EpisodeResult
    from agent_trainer.outer_loop.rl.metrics import step_metrics
    from agent_trainer.tracking import metric_key

    def result(base_model):
        return EpisodeResult("e", "t", "calc_chain", "finished", {k: 0.0 for k in (
            "total", "validation", "job_success", "quality", "speed")}, [], 1, [],
            {"base_model": base_model, "algorithm": "sft", "peft": "full"}, 0, 0, 0.0, 1.0)

    m = step_metrics([result({"r": 16, "alpha": 2}), result("tiny-m"), result("x" * 80), result("a/b")], {}, {}, None)
    assert m["share_base_model_other"] == 0.75 and m["share_base_model_tiny-m"] == 0.25
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with Tracker(uri, experiment="names") as tr:
        tr.log_metrics({metric_key(k): v for k, v in m.items()}, step=0)
        tr.log_metrics({"choice/share_base_model_{'r': 16}": 1.0}, step=1)  # the tracker's own guard
        run_id = tr.run_id
    keys = set(MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics)
    assert "choice/share_base_model_other" in keys and "choice/share_base_model___r_: 16_" in keys
