"""Trainer callbacks the harness adds to every inner run: budget, divergence, per-step log.

    guard = BudgetGuard(200, max_compute=75.0, step_compute=0.3, probe=encode_probe(tokenizer, rows),
                        vocab_size=len(tokenizer))
    log = StepLog("job/output/train_log.jsonl", clock=guard)
    trainer = GRPOTrainer(..., callbacks=[guard, log])
    trainer.train(); guard.stop_reason          # None, "timeout" (compute budget spent) or "diverged"

The budget is compute (``agent_trainer.inner_loop.spec.cost``): each step costs the cost model's seconds
per step, whatever the clock says, so a run stops at the same step on a busy machine as on a quiet one.
When a run stops or diverges, and how often the probe is checked: docs/inner_loop.md, "Outcomes".
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from transformers import TrainerCallback

from agent_trainer.inner_loop.run.job_env import STEP_DELAY_ENV
from agent_trainer.trace import TRACE_FILE, append, digest, json_digest, tracing, weights_digest


def _finite(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and math.isfinite(x))


def probe_loss(model, input_ids, labels) -> float:
    """Mean cross-entropy of the model on the probe's answer tokens (right padding needs no mask in a causal model)."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return float(model(input_ids=input_ids.to(model.device), labels=labels.to(model.device)).loss)
    finally:
        model.train(was_training)



# The job's own code (its reward files, in the reward host) may take this many wall seconds in all, plus
# AGENT_TIME_SHARE x the training's compute budget: far above what a reward that scores text takes (milliseconds a
# call) on any load, far below the wall-clock safety cap, so a reward slow on purpose ends its job as the job's
# ``timeout`` (scored, the agent's doing) instead of an ``infra_timeout`` (excluded, retried: the machine's).
AGENT_TIME_FLOOR_S = 60.0
AGENT_TIME_SHARE = 1.0


def agent_time_limit(max_compute: float | None) -> float:
    """Wall seconds the job's reward code may take in all, for a training of ``max_compute`` compute seconds."""
    return AGENT_TIME_FLOOR_S + AGENT_TIME_SHARE * max(0.0, max_compute or 0.0)


class AgentTime:
    """The job process's clock of agent code (``agent_trainer.inner_loop.isolation.reward_proxy.install`` sets it)."""

    def __init__(self):
        self.spent, self.limit = (lambda: 0.0), None

    def watch(self, spent, limit: float | None) -> None:
        self.spent, self.limit = spent, limit

    def over(self) -> bool:
        return self.limit is not None and self.spent() > self.limit


AGENT_TIME = AgentTime()


class BudgetGuard(TrainerCallback):
    """Stops training gracefully when the step or compute budget is spent, or the run diverges.

    ``max_compute``: compute seconds the training may spend (None: no compute cap), counted as
    ``step_compute`` per step; the wall clock never stops a run here (the harness's safety cap does)."""

    def __init__(self, max_steps: int, max_compute: float | None = None, step_compute: float = 0.0,
                 probe: tuple | None = None, vocab_size: int | None = None, check_every: int = 10):
        self.max_steps = max_steps
        self.check_every = max(1, int(check_every))
        self.max_compute = max_compute
        self.step_compute = float(step_compute)
        self.probe = probe
        self.loss_ceiling = 2 * math.log(vocab_size) if vocab_size else math.inf
        self.probe_loss: float | None = None
        self.checked_step: int | None = None   # the step the weights and the probe were last checked after
        self.t0: float | None = None
        self.cpu0: float | None = None
        self.stop_reason: str | None = None
        self.detail = ""

    def elapsed(self) -> float:
        """Seconds since training started (0 before)."""
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def cpu_seconds(self) -> float:
        """CPU seconds of this process (every thread) since training started (0 before): unlike the clock, they
        hardly move with the machine's load."""
        return 0.0 if self.cpu0 is None else time.process_time() - self.cpu0

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0, self.cpu0 = time.monotonic(), time.process_time()

    def _stop(self, control, reason: str, detail: str):
        # The first reason wins: a run that diverges and then runs out of time diverged.
        if self.stop_reason is None:
            self.stop_reason, self.detail = reason, detail
        control.should_training_stop = True

    def compute(self, steps: int) -> float:
        """Compute seconds ``steps`` steps cost."""
        return steps * self.step_compute

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        # Spent: the next step would not fit in the compute budget (a count of steps, never the clock).
        spent = self.max_compute is not None and self.compute(step + 1) > self.max_compute + 1e-9
        last = spent or step >= self.max_steps
        if model is not None and (last or step == 1 or step % self.check_every == 0):
            if self._check(model, step, control):
                return control
        if spent:
            self._stop(control, "timeout", f"compute budget of {self.max_compute:g} s spent after step {step} "
                                           f"({self.step_compute:g} s a step)")
        elif AGENT_TIME.over():
            self._stop(control, "timeout", f"the job's reward functions took {AGENT_TIME.spent():.0f} s by step "
                                           f"{step}, over the {AGENT_TIME.limit:.0f} s they may take; a reward "
                                           "must score a batch in well under a second")
        elif last:
            control.should_training_stop = True
        return control

    def _check(self, model, step: int, control) -> bool:
        """Weights finite and probe below the ceiling after ``step``; stops as diverged (True) if not."""
        self.checked_step = step
        bad = next((n for n, p in model.named_parameters() if p.requires_grad and not p.isfinite().all()), None)
        if bad is not None:
            self._stop(control, "diverged", f"non-finite weights in {bad} after step {step}; lower learning_rate")
            return True
        if self.probe is not None:
            self.probe_loss = probe_loss(model, *self.probe)
            if not self.probe_loss < self.loss_ceiling:  # also catches NaN
                self._stop(control, "diverged", f"cross-entropy on training answers {self.probe_loss:.3g} after "
                                                f"step {step} exceeds 2 ln(vocab) = {self.loss_ceiling:.3g} (worse "
                                                "than a uniform guess); lower learning_rate")
                return True
        return False

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # A run the trainer ended itself (data exhausted) was not checked at its last step yet.
        if model is not None and self.checked_step != state.global_step:
            self._check(model, state.global_step, control)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        # The loss, the gradient norm and every reward statistic (GRPO logs reward, reward_std and
        # rewards/<name>/mean): an inf reward zeroes the advantages and the run would go on learning nothing.
        keys = [k for k in logs if k in ("loss", "grad_norm") or k.startswith("reward")]
        for key in keys:
            value = logs.get(key)
            if not _finite(value) and (key in ("loss", "grad_norm") or isinstance(value, (int, float))):
                hint = "check the reward functions' values" if key.startswith("reward") else "lower learning_rate"
                self._stop(control, "diverged", f"{key} is {logs[key]} at step {state.global_step}; {hint}")
                break
        return control


class StepDelay(TrainerCallback):
    """Sleeps ``seconds`` after every step: a slow machine on demand, for tests (``STEP_DELAY_ENV``)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)
        return control


def injected_callbacks(log: "StepLog | None" = None) -> list[TrainerCallback]:
    """The callbacks asked for through the environment: ``StepDelay`` (tests: ``STEP_DELAY_ENV``), ``Trace``
    (``agent_trainer.trace.TRACE_ENV``, beside ``log``'s file, counting its steps); none otherwise."""
    delay = float(os.environ.get(STEP_DELAY_ENV) or 0)
    out: list[TrainerCallback] = [StepDelay(delay)] if delay > 0 else []
    if tracing() and log is not None:
        out.append(Trace(log.path.parent / TRACE_FILE, step_offset=log.step_offset, fields=log.fields))
    return out


class Trace(TrainerCallback):
    """Appends to ``path`` a digest of every step (``agent_trainer.trace``): what GRPO sampled and its rewards, the
    RNG state, loss, gradient norm and reward, and the trainable weights after the step; the weights tensor by
    tensor before the first step and after the last. ``attach`` the trainer: GRPO keeps its last sample there."""

    def __init__(self, path: str | Path, step_offset: int = 0, fields: dict | None = None):
        self.path = Path(path)
        self.step_offset = step_offset
        self.fields = dict(fields or {})
        self.trainer = None
        self.pending: dict | None = None   # a step's digest, written once its logs (loss, grad norm) arrive

    def attach(self, trainer) -> None:
        self.trainer = trainer

    def _weights(self, model, tensors: bool = False) -> dict:
        return weights_digest(((n, p) for n, p in model.named_parameters() if p.requires_grad), tensors=tensors)

    def _write(self, event: str, step: int, **values) -> None:
        append(self.path, {"event": event, "step": step + self.step_offset, **self.fields, **values})

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self.path.is_file() or not self.path.stat().st_size:
            from agent_trainer.inner_loop.run.result import library_versions
            from agent_trainer.kernels import cpu_kind

            append(self.path, {"event": "trace", "cpu": cpu_kind(), "software": library_versions()})
        if model is not None:
            self._write("start", state.global_step, **self._weights(model, tensors=True))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        import torch

        record: dict = {}
        sampled = getattr(self.trainer, "_logs", None)   # TRL's GRPOTrainer: the last generation's batch
        if isinstance(sampled, dict) and sampled.get("completion"):
            record["completions"] = json_digest(list(sampled["completion"]))
            record["rewards"] = json_digest({k: list(v) for k, v in sampled["rewards"].items()})
        record["rng"] = digest(torch.get_rng_state().numpy().tobytes())
        if model is not None:
            record.update(self._weights(model))
        self.pending = {"step": state.global_step, **record}
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.pending is not None and "train_runtime" not in (logs or {}):
            step = self.pending.pop("step")
            logged = {k: (logs or {})[k] for k in ("loss", "grad_norm", "reward") if k in (logs or {})}
            self._write("step", step, **logged, **self.pending)
            self.pending = None
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.pending is not None:   # a step no log followed
            self._write("step", self.pending.pop("step"), **self.pending)
            self.pending = None
        if model is not None:
            self._write("end", state.global_step, **self._weights(model, tensors=True))
        return control


class StepLog(TrainerCallback):
    """Appends one JSON line per logged step to ``train_log.jsonl`` (also the harness's progress feed).

    A new log starts empty; ``append=True`` continues an existing one (a later stage of a job),
    its steps counted on from ``step_offset`` and every record carrying ``fields`` (e.g. the stage).
    """

    def __init__(self, path: str | Path, clock: BudgetGuard, append: bool = False, step_offset: int = 0,
                 fields: dict | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not append:
            self.path.write_text("")
        self.clock = clock
        self.step_offset = step_offset
        self.fields = dict(fields or {})
        self.records: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "train_runtime" in logs:  # the end-of-run summary, not a step
            return control
        record = {"step": state.global_step + self.step_offset, "seconds": round(self.clock.elapsed(), 3),
                  "cpu_seconds": round(self.clock.cpu_seconds(), 3), **self.fields}
        if self.clock.probe_loss is not None and getattr(self.clock, "checked_step", None) == state.global_step:
            record["probe_loss"] = self.clock.probe_loss   # measured after this very step
        if "learning_rate" in logs:
            record["lr"] = logs.pop("learning_rate")
        for k, v in logs.items():
            if isinstance(v, (int, float)):
                # JSON has no NaN/inf; keep them readable as strings.
                record[k] = v if math.isfinite(v) else str(v)
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        return control
