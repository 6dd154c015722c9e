"""Which float kernels a process runs (``hardware.cpu_kernels``), and the kind of CPU that decides its numbers.

    use_cpu_kernels("portable")   # before torch's first kernel: torch's AVX2 level, MKL's COMPATIBLE branch
    cpu_kind()                    # {"machine", "vendor", "torch_capability", and any KERNEL_ENV setting given}

A trained model's last digits, so sometimes its score, depend on these (docs/inner_loop.md, "The same numbers on
another CPU"). The settings live in the environment: torch reads ``ATEN_CPU_CAPABILITY`` at its first kernel, MKL
``MKL_CBWR`` at its first call, and every job's process gets them (``agent_trainer.inner_loop.run.job_env``).
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from pathlib import Path

# Which CPU kernels torch, MKL and oneDNN run: set in the harness's environment, they reach every job's training
# process too (through its sandbox), so one setting pins the whole run's arithmetic.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


# hardware.cpu_kernels=portable: torch's AVX2 kernels (the same instructions on any x86-64 CPU since ~2015) and
# MKL's COMPATIBLE branch, the one MKL documents as giving the same results on Intel and non-Intel CPUs.
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def use_cpu_kernels(kernels: str) -> None:
    """``native`` leaves the environment as it is; ``portable`` puts ``PORTABLE_KERNELS`` in this process's
    environment, where torch reads them at its first kernel call, MKL at its first call, and every job's process
    finds them (``agent_trainer.inner_loop.run.job_env.child_env``). Raises when torch had already chosen other
    kernels in this process."""
    if kernels != "portable":
        return
    os.environ.update(PORTABLE_KERNELS)
    if "torch" in sys.modules:
        import torch

        level = torch.backends.cpu.get_cpu_capability()
        if level != "AVX2":
            raise RuntimeError(f"hardware.cpu_kernels=portable: torch runs its {level} kernels in this process "
                               "(a CPU without AVX2, or kernels chosen before the setting); the numbers would not "
                               "be the portable ones")


def portable(cpu: dict[str, str]) -> bool:
    """Whether ``cpu`` (``cpu_kind``) ran the portable kernels, whose numbers do not depend on the vendor."""
    return cpu.get("torch_capability") == "AVX2" and all(cpu.get(k) == v for k, v in PORTABLE_KERNELS.items()
                                                         if k != "ATEN_CPU_CAPABILITY")


def cpu_kind() -> dict[str, str]:
    """What decides which float kernels a job runs, so which numbers it makes: the architecture, the vendor (MKL
    and oneDNN dispatch on it), torch's CPU capability, and the ``KERNEL_ENV`` settings given."""
    import torch

    kernels = {k: os.environ[k] for k in KERNEL_ENV if os.environ.get(k) and k != "ATEN_CPU_CAPABILITY"}
    return {"machine": platform.machine(), "vendor": _vendor(),
            "torch_capability": torch.backends.cpu.get_cpu_capability(), **kernels}


@functools.lru_cache(maxsize=1)
def _vendor() -> str:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``), read once a process: the job cache asks per job."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
