"""What a job's training process is given: its environment variables, its GPUs, its file-size cap.

Shared by the worker's parent side (``agent_trainer.inner_loop.run.worker``), the sandbox
(``agent_trainer.inner_loop.isolation.sandbox``), the executors (``agent_trainer.inner_loop.run.executor``) and the
harness's scoring (``agent_trainer.inner_loop.run.job``).
"""

from __future__ import annotations

import os
from pathlib import Path

from agent_trainer.kernels import KERNEL_ENV
from agent_trainer.registry import configured_env
from agent_trainer.trace import TRACE_ENV

MAX_FILE_BYTES = 16 * 2**30  # a 1.7B fp32 checkpoint fits; a runaway writer does not fill the disk
# A test hook passed through to the training process: seconds each step sleeps (a slow or busy machine on
# demand; agent_trainer.inner_loop.train.callbacks.StepDelay). Unset everywhere but in tests.
STEP_DELAY_ENV = "AGENT_TRAINER_TEST_STEP_DELAY_S"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (what SLURM, a container's cpuset or ``taskset`` give
    it), else the machine's count. Threads and parallel jobs are sized by this, never by the whole machine."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):   # no affinity on this platform
        return os.cpu_count() or 1


def child_env(home: Path, threads: int | None, gpus: str | None = None) -> dict[str, str]:
    """Only what Python and torch need: no API keys or tracking credentials reach agent code.

    ``gpus``: the job's ``CUDA_VISIBLE_DEVICES`` (``""`` hides every GPU; None: none set, so the
    process sees what the machine has)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home),
           "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(home / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    # Families and base models from configuration (agent_trainer.registry): the job's rows may come from them.
    env.update(configured_env())
    for name in (STEP_DELAY_ENV, TRACE_ENV, *KERNEL_ENV):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def job_gpus(device: str, gpus: str | None) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` of a job's process: none on the CPU; on a GPU the ones the executor
    gave the job (``gpus``), else what this process was given (SLURM and Ray set it), else unset."""
    if device == "cpu":
        return ""
    return gpus if gpus is not None else os.environ.get("CUDA_VISIBLE_DEVICES")


def gpu_ids(value: str) -> list[str]:
    """The GPU ids in a ``CUDA_VISIBLE_DEVICES`` value (``"4, 5"`` -> ``["4", "5"]``; ``""`` -> none)."""
    return [x.strip() for x in value.split(",") if x.strip()]
