"""The agent's policy: a causal LM with a PEFT LoRA adapter, updated by Lightning on the clipped objective.

What the update optimises is ``objective`` (advantages, the clipped loss, the KL term); how the log-probs are
computed within memory is ``logprobs``. This module holds the model, the Lightning step that joins the two
(micro-batches accumulated into one optimizer step), and checkpointing.

    policy = AgentPolicy.from_pretrained(model_dir, OuterConfig(lora_r=16))   # the outer group's settings
    stats = policy.update(samples)          # one outer step over a list of TurnSample
    policy.save(step_dir); policy.load_state(step_dir)
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path

import lightning as L
from lightning.pytorch.plugins.environments import LightningEnvironment
import torch
from torch.utils.data import DataLoader

from agent_trainer.config import OuterConfig
from agent_trainer.outer_loop.rl.logprobs import collate, focus_samples, micro_batches, token_logprobs
from agent_trainer.outer_loop.rl.objective import TurnSample, clipped_loss

ADAPTER_DIR = "adapter"
OPTIMIZER_FILE = "optimizer.pt"


# The adapter's dropout and the optimizer's weight decay: none (the update is a few steps of a small LoRA).
LORA_DROPOUT = 0.0
WEIGHT_DECAY = 0.0


def _quiet_lightning() -> None:
    """Lightning announces devices and tips on every Trainer; one per outer step is noise."""
    import logging
    import warnings

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
    # Lightning's resume check asks SLURM's detection even with the environment pinned (plugins= below): the
    # hint to launch with srun is wrong for one process on a login node or inside a SLURM job.
    warnings.filterwarnings("ignore", message=".*The `srun` command is available.*")
    # Deprecation notices from inside lightning/transformers (not our calls), once per outer step otherwise.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")


class PolicyModule(L.LightningModule):
    """Lightning module for the clipped, group-relative policy-gradient step (docs/outer_loop.md: "The update")."""

    def __init__(self, model, config: OuterConfig):
        super().__init__()
        self.model = model
        self.config = config
        self._optimizer: torch.optim.Optimizer | None = None
        self.last_stats: dict[str, float] = {}
        self._acc: dict[str, list[float]] = {}
        self.norm: float | None = None   # sum of token weights of the whole step (set by AgentPolicy.update)
        self.pg_norm: float | None = None  # the same over the policy-gradient (focused) tokens
        self.accumulate = 1              # micro-batches per optimizer step

    def configure_optimizers(self):
        # One optimizer for the whole training: a fresh Trainer per outer step reuses it, so Adam's
        # moments carry over from step to step (and are checkpointed with the adapter).
        if self._optimizer is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self._optimizer = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=WEIGHT_DECAY)
        return self._optimizer

    def on_before_optimizer_step(self, optimizer):
        """Linear lr warm-up over the first ``lr_warmup_steps`` optimizer steps. Adam's first step moves
        every adapter weight by the full lr whatever its gradient (m / sqrt(v) is the gradient's sign),
        which at the outer lr dropped a few tokens' log-probs by ~10 nats. The count is Adam's own step
        counter, which is checkpointed with the optimizer, so a resumed run continues the schedule."""
        warm = self.config.lr_warmup_steps
        if warm <= 0:
            return
        done = max((int(st["step"]) for st in optimizer.state.values() if "step" in st), default=0)
        for group in optimizer.param_groups:
            group["lr"] = self.config.lr * min(1.0, (done + 1) / warm)

    def training_step(self, batch, batch_idx):
        new = token_logprobs(self.model, batch)
        ref = None
        if self.config.kl_beta > 0:
            with torch.no_grad(), self.model.disable_adapter():
                ref = token_logprobs(self.model, batch)
        loss, stats = clipped_loss(new, batch, self.config, ref, self.norm, self.pg_norm)
        # Lightning divides a returned loss by accumulate_grad_batches: the micro-batches' gradients add up to the
        # step's objective (``clipped_loss``'s whole-step norms), accumulated into one optimizer step per epoch.
        scaled = loss * self.accumulate
        stats["loss"] = scaled.item() / self.accumulate   # the loss as backpropagated, in the step's units
        for k, v in stats.items():
            self._acc.setdefault(k, []).append(v)
        return scaled

    def on_train_epoch_end(self):
        # loss: the step's objective (its micro-batch parts add up); tokens: a count; the rest: means.
        epochs = self.current_epoch + 1
        self.last_stats = {k: (sum(v) / epochs if k in ("tokens", "loss") else sum(v) / len(v))
                           for k, v in self._acc.items()}


def device_kwargs(device: str) -> dict:
    """Lightning ``Trainer`` kwargs of the policy's update on ``device`` (``cpu`` or ``cuda``): one GPU in bf16
    mixed precision where it has bf16 (fp32 weights and optimizer state, as the CPU's)."""
    if device == "cpu":
        return {"accelerator": "cpu", "devices": 1}
    return {"accelerator": "gpu", "devices": 1,
            "precision": "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"}


def return_large_frees_to_os(threshold: int = 1 << 20) -> bool:
    """Have glibc serve allocations of ``threshold`` bytes and more by mmap, so that freeing one gives its pages
    back at once, and give back now what its heaps hold free. By default glibc raises that threshold after large
    frees and then keeps freed activations in its heap: on SmolLM2 (1,500-token sequence, LoRA, checkpointing) the
    update's peak RSS was 2.7 GB with the default and 1.1 GB with this, the same tensors in both. The setting only
    governs later allocations: what the heap already held free (a warm start trained in the same process, earlier
    work) stays resident until ``malloc_trim(0)`` hands it back. False where the C library has no ``mallopt``
    (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(-3, int(threshold)))   # -3: M_MMAP_THRESHOLD
        libc.malloc_trim(0)
        return ok
    except (OSError, AttributeError):
        return False


class AgentPolicy:
    """The agent model with its LoRA adapter, the Lightning update, and checkpointing.

    ``trainer_kwargs`` go to Lightning's ``Trainer`` (``device_kwargs``); with a GPU accelerator the model
    lives on the GPU between updates too, where the local backend samples from it."""

    def __init__(self, model, tokenizer, config: OuterConfig, trainer_kwargs: dict | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.module = PolicyModule(model, config)
        self.trainer_kwargs = dict(trainer_kwargs or {})
        self.device = torch.device("cuda" if self.trainer_kwargs.get("accelerator") in ("gpu", "cuda") else "cpu")
        self.model.to(self.device)
        return_large_frees_to_os()
        if config.gradient_checkpointing:
            # Non-reentrant: frees each layer's activations even though the frozen inputs need no gradient
            # (the reentrant kind needs enable_input_require_grads and keeps them under PEFT).
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            if hasattr(base, "activation_checkpointing_enable"):   # transformers >= 5.2x
                base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            base.config.use_cache = False
        self.version = 0  # number of updates applied

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: OuterConfig, adapter_dir: str | Path | None = None,
                        trainer_kwargs: dict | None = None, seed: int = 0) -> "AgentPolicy":
        """Load the base agent from ``model_dir`` and add a fresh (or saved) LoRA adapter.

        A fresh adapter's random half (LoRA A) is drawn from ``seed``, without touching the global RNG:
        two runs of one seed start from the same policy (PEFT draws from torch's global RNG, which
        nothing had seeded: runs of the same seed differed from their first update)."""
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        _quiet_lightning()   # PEFT's wrapping calls a deprecated transformers property (a FutureWarning otherwise)

        tok = AutoTokenizer.from_pretrained(model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if adapter_dir is not None:
            model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
        else:
            lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=LORA_DROPOUT,
                              target_modules=config.lora_target_modules, task_type="CAUSAL_LM")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = get_peft_model(base, lora)
        return cls(model, tok, config, trainer_kwargs)

    def update(self, samples: list[TurnSample]) -> dict[str, float]:
        """One outer step: ``config.epochs`` passes of the clipped objective over ``samples``."""
        samples = [s for s in samples if s.completion_ids]
        if not samples:
            return {"skipped": 1.0}
        if self.config.kl_beta == 0 and all(s.advantage == 0 for s in samples):
            # Equal rewards and no KL term: the gradient is zero. An optimizer step would still move the adapter
            # by Adam's momentum (and weight decay) with no signal; the adapter and the optimizer stay as they are.
            return {"skipped": 1.0, "samples": float(len(samples))}
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        focus: dict[str, float] = {}
        if self.config.focus_top_frac < 1:
            self.model.eval()
            before = sum(s.n_targets for s in samples)
            reference = self.config.focus_entropy_of == "reference" and hasattr(self.model, "disable_adapter")
            with self.model.disable_adapter() if reference else contextlib.nullcontext():
                samples, threshold = focus_samples(self.model, samples, self.config.focus_top_frac, pad,
                                                   self.config.micro_batch_size,
                                                   per_episode_weights=self.config.loss_aggregation == "episode",
                                                   micro_batch_tokens=self.config.micro_batch_tokens,
                                                   share_prefix=self.config.share_prefix)
            focus = {"focus_entropy_threshold": threshold,
                     "focus_kept": sum(s.n_focus for s in samples) / max(1, before)}
        share = self.config.share_prefix
        batches = micro_batches(samples, self.config.micro_batch_size, self.config.micro_batch_tokens, share)
        loader = DataLoader(batches, batch_size=None, shuffle=False, collate_fn=lambda b: collate(b, pad, share))
        n_batches = len(batches)
        self.module.norm = max(1e-12, sum(s.weight * s.n_targets for s in samples))
        self.module.pg_norm = max(1e-12, sum(s.pg_weight * s.n_focus for s in samples))
        self.module.accumulate = n_batches
        kwargs = dict(accelerator="cpu", devices=1, max_epochs=self.config.epochs, logger=False,
                      accumulate_grad_batches=n_batches,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      gradient_clip_val=self.config.max_grad_norm, num_sanity_val_steps=0,
                      # One process, whatever the environment: inside a SLURM job (a sweep's run) Lightning would
                      # read SLURM_* as a multi-process launch, and with srun on the PATH it warns at every update.
                      plugins=[LightningEnvironment()])
        kwargs.update(self.trainer_kwargs)
        _quiet_lightning()
        self.model.train()
        self.module._acc = {}
        L.Trainer(**kwargs).fit(self.module, train_dataloaders=loader)
        self.model.to(self.device).eval()   # Lightning's teardown leaves the model on the CPU
        return_large_frees_to_os()   # the heap's freed fragments back before the next sampling
        self.version += 1
        return dict(self.module.last_stats, samples=float(len(samples)), **focus)

    @torch.no_grad()
    def merged_weights(self):
        """(name, tensor) of the base model's weights with the LoRA folded in, under the base model's own
        (transformers) names: what a vLLM engine of the same base loads (``VLLMBackend.load_weights``).

        Computed as W + delta (PEFT's ``get_delta_weight``), not by merging in place and back, which would
        leave rounding in the frozen weights after every update."""
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        deltas = {f"{name}.weight": sum(m.get_delta_weight(a) for a in m.active_adapters if a in m.lora_A)
                  for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        for name, param in base.named_parameters():
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            yield name, (param + deltas[name]) if name in deltas else param

    # --- checkpoints ---------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Write the adapter, the optimizer state and the version into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(d / ADAPTER_DIR))
        state = {"version": self.version, "config": asdict(self.config)}
        if self.module._optimizer is not None:
            state["optimizer"] = self.module._optimizer.state_dict()
        torch.save(state, d / OPTIMIZER_FILE)

    def load_state(self, directory: str | Path) -> None:
        """Restore the optimizer state and version saved by ``save`` (the adapter is loaded by from_pretrained)."""
        state = torch.load(Path(directory) / OPTIMIZER_FILE, weights_only=False)
        self.version = int(state["version"])
        if "optimizer" in state:
            self.module.configure_optimizers().load_state_dict(state["optimizer"])

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Copies of the trainable (LoRA) tensors, for tests and diagnostics."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def frozen_state(self) -> dict[str, torch.Tensor]:
        """Copies of the frozen (base) tensors."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if not p.requires_grad}
