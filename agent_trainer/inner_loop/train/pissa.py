"""PiSSA's initialisation under the portable kernels: the same adapter whatever code path MKL takes on the CPU.

    with portable_pissa(spec.peft):        # around the trainer's construction (it wraps the model in PEFT)
        trainer = GRPOTrainer(..., peft_config=lora_config(spec.peft))

PEFT's ``init: pissa`` takes a float32 ``torch.linalg.svd`` of every target weight (LAPACK's gesdd, in MKL). Its
result depends on MKL's code path beyond the last bit: the tiny models' weights have close singular values, so the
top-r singular vectors turn within a near-degenerate subspace (on one AMD EPYC, ``MKL_CBWR=AVX2`` instead of
``COMPATIBLE`` moved the adapter's weights at 1e-4 relative, every tensor). Here the SVD is taken in float64 (whose
vectors differ between MKL's code paths at ~1e-14), each singular pair's sign fixed (the largest entry of the left
vector positive), and A and B rounded to 20 mantissa bits (~1e-6) before they become float32: an element lands on
a rounding boundary about once in 10^8, so every code path gives the same bits (docs/reproducibility.md). The base
keeps ``W - scale * B @ A`` as in PEFT. Only where ``hardware.cpu_kernels=portable``: native kernels keep PEFT's
own init, so native numbers do not move.
"""

from __future__ import annotations

import contextlib

# Mantissa bits A and B keep: far coarser than float64's differences between code paths, far finer than training.
PISSA_BITS = 20


def _portable_init(original):
    def pissa_init(self, adapter_name, init_lora_weights):
        if init_lora_weights != "pissa":   # pissa_niter_<n> (a randomized SVD): PEFT's own
            return original(self, adapter_name, init_lora_weights)
        import torch
        from peft.utils.other import transpose

        from agent_trainer.trace import rounded

        base = self.get_base_layer()
        dtype = base.weight.dtype
        weight = transpose(base.weight.to(torch.float32), self.fan_in_fan_out)
        r, scale = self.r[adapter_name], self.scaling[adapter_name]
        u, s, vh = torch.linalg.svd(weight.data.to(torch.float64), full_matrices=False)
        u, s, vh = u[:, :r], s[:r] / scale, vh[:r]
        sign = torch.sign(u.gather(0, u.abs().argmax(0, keepdim=True)))   # a singular pair's sign is arbitrary
        u, vh = u * sign, vh * sign.T

        def snap(t):
            return rounded(t.to(torch.float32).contiguous(), PISSA_BITS).view(torch.float32)

        lora_a, lora_b = snap(torch.diag(s.sqrt()) @ vh), snap(u @ torch.diag(s.sqrt()))
        self.lora_A[adapter_name].weight.data = lora_a
        self.lora_B[adapter_name].weight.data = lora_b
        base.weight.data = transpose((weight.data - scale * lora_b @ lora_a).to(dtype), self.fan_in_fan_out)

    return pissa_init


@contextlib.contextmanager
def portable_pissa(peft):
    """While the block runs, PEFT's PiSSA init is the portable one (module docstring), if ``peft`` (a job's
    ``PeftSpec`` or None) asks for PiSSA and this process runs the portable kernels; else nothing changes."""
    from agent_trainer.kernels import cpu_kind, portable

    if peft is None or peft.init != "pissa" or not portable(cpu_kind()):
        yield
        return
    from peft.tuners.lora.layer import LoraLayer

    original = LoraLayer.pissa_init
    LoraLayer.pissa_init = _portable_init(original)   # PEFT offers no hook for the SVD it takes
    try:
        yield
    finally:
        LoraLayer.pissa_init = original
