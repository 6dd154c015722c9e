"""A sweep job's name and tags carry the values the sweep chose, not the overrides every job of it shares."""

from __future__ import annotations

from agent_trainer.sweeps import short_settings, swept_of


def test_only_the_swept_values_name_a_sweep_job():
    on_line = ["experiment=smoke", "outer.lora_r=4,8", "model=tiny-s,tiny-m", "+base_models.mine.path=/m",
               "tracking.tracking_uri=sqlite:////tmp/rp/mlflow.db"]
    # as Hydra hands them to job 1 (a value with a colon comes back escaped); outer.lr is Optuna's choice
    job = ["experiment=smoke", "outer.lora_r=8", "model=tiny-m", "+base_models.mine.path=/m",
           "tracking.tracking_uri=sqlite\\:////tmp/rp/mlflow.db", "outer.lr=0.001"]
    swept = swept_of(job, on_line)
    assert swept == {"outer.lora_r": "8", "model": "tiny-m", "outer.lr": "0.001"}
    assert short_settings(swept) == ["lora_r=8", "model=tiny-m", "lr=0.001"]
