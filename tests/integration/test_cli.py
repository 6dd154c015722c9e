"""The at-* commands: the real console scripts for what only a process shows (one error line, exit
codes, Hydra's run folder), and ``run(cfg)`` called directly for the end-to-end pipeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from agent_trainer.config import compose_config

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
SPEC = "examples/tasks/reverse_text_v1_fast.json"


def at(command: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([str(BIN / command), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command,args,text", [
    ("at-eval", ["outer.lrr=1"], "lrr"),
    ("at-job", ["examples/jobs/no_such_job", "task=examples/tasks/nope.json"], "nope.json"),
    # unknown key, wrong type, missing file or folder, for every command
    ("at-job", ["examples/jobs/sft_full", "inner.nope=1"], "nope"),
    ("at-job", ["examples/jobs/sft_full", "inner.eval_size=many"], "inner.eval_size=many"),
    ("at-eval", ["inner.eval_size=1.5"], "inner.eval_size=1.5"),
    ("at-eval", ["task=examples/tasks/missing.json"], "missing.json"),
    ("at-eval", ["model=tiny-s", "checkpoint=/nonexistent/ckpt", "tracking=off"], "/nonexistent/ckpt"),
    ("at-episode", ["agent.tempo=1"], "tempo"),
    ("at-episode", ["agent.temperature=hot"], "agent.temperature=hot"),
    ("at-episode", ["task=examples/tasks/missing.json"], "missing.json"),
    ("at-train", ["outer.stepz=3"], "stepz"),
    ("at-train", ["outer.steps=two"], "outer.steps=two"),
    ("at-train", ["outer.reward.quality=-1"], "outer.reward.quality: a reward weight must be >= 0"),
    ("at-train", ["resume=/nonexistent/run", "tracking=off"], "/nonexistent/run"),
    ("at-train", ["resume=true", "tracking=off"], "completed a step; start one without resume"),
    ("at-train", ["experiment=smoke", "agent.model_path=/nonexistent/agent", "tracking=off"],
     "agent.model_path=/nonexistent/agent: no model there"),
    ("at-models", ["nope=1"], "nope"),
    ("at-models", ["seed=abc"], "seed=abc"),
])
def test_user_mistakes_end_with_one_line_and_nonzero_exit(tmp_path, command, args, text):
    proc = at(command, f"runs_dir={tmp_path}", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0] and lines[0].startswith(f"{command}: error:"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not list(tmp_path.glob("*/run.json")), "a user error leaves no run folder"


def test_missing_job_folder_is_one_line_from_inside_the_run(tmp_path):
    proc = at("at-job", "examples/jobs/no_such_job", f"runs_dir={tmp_path}", "tracking=off")
    assert proc.returncode == 2 and "no job.yaml" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_dry_run_writes_the_run_folder(tmp_path):
    proc = at("at-eval", "dry_run=true", f"task={SPEC}", f"runs_dir={tmp_path}", "run_id=r1", "outer.lr=0.002")
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "r1"
    overrides = OmegaConf.load(run / ".hydra" / "overrides.yaml")
    assert f"task.spec_path={ROOT / SPEC}" in overrides and "outer.lr=0.002" in overrides
    assert OmegaConf.load(run / ".hydra" / "config.yaml").outer.lr == 0.002
    assert OmegaConf.load(run / "config.resolved.yaml").task.spec_path == str(ROOT / SPEC)
    versions = json.loads((run / "versions.json").read_text())
    assert versions["torch"].startswith("2.") and versions["python"].startswith("3.")
    assert "cpu" not in versions, "a dry run loads no torch, runs no kernel: no kind of CPU to record"


def test_portable_kernels_are_the_ones_torch_runs_and_the_run_records_them(tmp_path):
    """hardware.cpu_kernels=portable: the command's torch runs its AVX2 kernels and MKL its COMPATIBLE branch
    (the settings go into the environment before torch's first kernel), and versions.json records them."""
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("portable kernels need an x86-64 CPU with AVX2")
    proc = at("at-eval", f"task={SPEC}", "inner.eval_size=8", "hardware.cpu_kernels=portable", "tracking=off",
              f"runs_dir={tmp_path}", "run_id=portable")
    assert proc.returncode == 0, proc.stderr
    cpu = json.loads((tmp_path / "portable" / "versions.json").read_text())["cpu"]
    assert cpu["torch_capability"] == "AVX2" and cpu["MKL_CBWR"] == "COMPATIBLE", cpu


@pytest.mark.slow
def test_models_then_eval_end_to_end(tmp_path, built_agent, capsys):
    """at-models then at-eval through their run(cfg): a real score, logged to MLflow and read back."""
    from agent_trainer.commands import eval as at_eval
    from agent_trainer.commands import models as at_models

    models = at_models.run(compose_config([f"runs_dir={tmp_path}", "run_id=models"], "models"))
    assert models and all(Path(p).is_dir() for p in models.values())
    # which it is: the package's shipped files, their weights' sha256 checked
    printed = capsys.readouterr().out
    for name in ("tiny-s", "tiny-m", "tiny-agent"):
        sha = json.loads((models[name].parent / "SHA256SUMS.json").read_text())["models"][name]["files"]
        line = next(line for line in printed.splitlines() if line.startswith(name))
        assert f"shipped with the package: weights sha256 {sha['model.safetensors'][:12]}" in line, line

    cfg = compose_config([f"runs_dir={tmp_path}", "run_id=eval", "model=tiny-s", "inner.eval_size=16",
                          f"task.spec_path={ROOT / 'examples/tasks/calc_chain_v1_fast.json'}"], "eval")
    score = at_eval.run(cfg)
    summary = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert 0.0 <= score <= 1.0 and summary["hidden_score"] == score and summary["n"] == 16
    # the base model scored against its own baseline: no uplift
    assert summary["baseline"] == pytest.approx(score)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve()}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("agent-trainer").experiment_id])
    assert run.data.metrics["eval/hidden_score"] == pytest.approx(score)
    assert run.data.params["model.name"] == "tiny-s" and run.data.params["inner.eval_size"] == "16"

    at_eval.run(compose_config([f"runs_dir={tmp_path}", "run_id=table", "table=true", "tracking=off",
                                "inner.eval_size=16"], "eval"))
    assert (tmp_path / "table" / "baselines.md").read_text().strip()


def test_an_adapter_of_an_at_train_run_samples_as_that_run_did(tmp_path, capsys):
    """``at-episode adapter=runs/<id>/checkpoints/step_N/adapter`` plays the trained agent with its run's agent
    settings (at-train's default samples at 0.5, at-episode's agent group at 0.7); the command line's win, and an
    adapter outside a run is left as given."""
    from agent_trainer.cli_args import expand_adapter

    run = tmp_path / "runs" / "r"
    adapter = run / "checkpoints" / "step_0003" / "adapter"
    adapter.mkdir(parents=True)
    trained = compose_config(["agent.max_turns=5", "agent.tool_schemas=compact"], "train")
    (run / "config.resolved.yaml").write_text(OmegaConf.to_yaml(trained, resolve=True))
    assert trained.agent.temperature == 0.5 and compose_config([], "episode").agent.temperature == 0.7
    for argv, temperature in (([f"adapter={adapter}"], 0.5), ([f"adapter={adapter}", "agent.temperature=0.9"], 0.9)):
        cfg = compose_config(expand_adapter(argv), "episode")
        assert (cfg.agent.temperature, cfg.agent.max_turns, cfg.agent.tool_schemas) == (temperature, 5, "compact")
        assert cfg.agent.model == trained.agent.model and cfg.adapter == str(adapter)
    assert "agent.temperature=0.5" in capsys.readouterr().err
    swept = ["-m", "seed=0,1", f"adapter={adapter}"]
    assert expand_adapter(swept)[-3:] == swept and len(expand_adapter(swept)) > 3
    elsewhere = tmp_path / "mine" / "adapter"
    elsewhere.mkdir(parents=True)
    assert expand_adapter([f"adapter={elsewhere}"]) == [f"adapter={elsewhere}"]


def test_a_family_name_given_as_task_says_which_specs_or_what_to_write(tmp_path):
    """``task=calc_chain`` names the family's specs; ``task=<a card on the include path>`` says at-train plays it by
    name and the other commands take a spec file; anything else lists the known tasks."""
    from agent_trainer.cli_args import UserError, rewrite_args

    with pytest.raises(UserError, match="task=calc_chain_v1_fast or task=calc_chain_v1_tiny"):
        rewrite_args(["task=calc_chain"])
    (tmp_path / "mood.yaml").write_text("name: mood\n")
    with pytest.raises(UserError, match=r"task.train_families=\[mood\]"):
        rewrite_args(["task=mood", f"task.include_path=[{tmp_path}]"])
    with pytest.raises(UserError, match="unknown task 'mood'; known: "):
        rewrite_args(["task=mood"])
