"""Cost model of an inner job: estimated wall seconds and USD, before the job runs.

    estimate_cost(spec, CostModel()).summary()     # '48 s, $0.0013 (150 steps, ...)'
    CostModel.measured("cpu")                      # with this machine's factors (at-models calibrate)

A linear model: start-up, plus steps times a per-step cost by algorithm, model and LoRA, plus
sampling; ``estimate_job`` prices a multi-stage job. The formula and its calibration points:
docs/inner_loop.md, "Cost model".
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Slowdown per step relative to tiny-s, on the same hardware. A model from configuration brings its
# own (``base_models.<name>.cost_factor``); without one it is priced like the slowest model here.
DEFAULT_MODEL_FACTORS = {"tiny-s": 1.0, "tiny-m": 1.8, "smollm2-135m": 76.0, "qwen3-0.6b": 1200.0,
                         "qwen3-1.7b": 3500.0}
# Per algorithm and prompt format, as `at-models calibrate model=smollm2-135m` measured them on the project's
# 2-core CPU box (SFT-LoRA at batch 16: 1.71 s a step raw, 10.2 s chat, whose rows are 5-8x longer; GRPO-LoRA:
# 3.8 s, 14.8 s). A profile measured on the machine at hand replaces them.
DEFAULT_PROFILE = {"smollm2-135m": {"sft": 76.0, "grpo": 61.0, "dpo": 76.0, "sft:chat": 454.0, "grpo:chat": 237.0,
                                    "dpo:chat": 454.0}}


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the linear cost model (see the module docstring)."""

    startup_s: float = 15.0
    grpo_step_s: float = 0.047
    grpo_token_s: float = 0.0000567
    sft_step_s: float = 0.008
    sft_sequence_s: float = 0.0005
    lora_factor_grpo: float = 1.15
    lora_factor_sft: float = 1.4
    dpo_step_s: float = 0.03
    dpo_pair_s: float = 0.003
    lora_factor_dpo: float = 1.2
    sample_token_s: float = 0.0001
    usd_per_hour: float = 0.10
    model_factors: dict = field(default_factory=lambda: dict(DEFAULT_MODEL_FACTORS))
    # Measured on this machine (``at-models calibrate``): model -> {"sft"|"grpo"|"dpo"[":chat"]: factor}; wins
    # over model_factors for that algorithm and prompt format (``CostModel.measured`` reads the cache's profile).
    profile: dict = field(default_factory=lambda: {m: dict(f) for m, f in DEFAULT_PROFILE.items()})

    @classmethod
    def measured(cls, device: str = "cpu", cache_dir=None, **overrides) -> "CostModel":
        """The default coefficients with this machine's measured profile (``at-models calibrate``), if any."""
        measured = load_profile(machine_key(device), cache_dir)
        profile = {m: {**DEFAULT_PROFILE.get(m, {}), **measured.get(m, {})} for m in {*DEFAULT_PROFILE, *measured}}
        return cls(profile=profile, **overrides)


@dataclass
class CostEstimate:
    """Estimated seconds and USD of one job, and how they were computed."""

    seconds: float
    usd: float
    steps: int
    step_seconds: float
    startup_seconds: float
    formula: str
    sampling_seconds: float = 0.0  # sampling the model before training (DPO pairs, self-generated data)

    def train_seconds(self, steps_run: int | None = None) -> float:
        """Estimated seconds of the training itself, without the start-up: the sampling and ``steps_run``
        steps (all of them when None). Deterministic: the staged reward's speed stage reads it."""
        n = self.steps if steps_run is None else max(0, min(steps_run, self.steps))
        return round(self.sampling_seconds + n * self.step_seconds, 3)

    def steps_within(self, seconds: float) -> int:
        """How many steps fit in ``seconds`` under the same per-step cost."""
        fixed = self.startup_seconds + self.sampling_seconds
        return max(0, int((seconds - fixed) / self.step_seconds)) if self.step_seconds else self.steps

    def summary(self) -> str:
        sampling = f" + {self.sampling_seconds:.0f} s sampling" if self.sampling_seconds else ""
        return (f"{self.seconds:.0f} s, ${self.usd:.4f} ({self.steps} steps x {self.step_seconds:.3f} s{sampling} "
                f"+ {self.startup_seconds:.0f} s start-up; {self.formula})")


def sampled_tokens(spec) -> int:
    """Sequence-tokens a single-stage spec samples before training: DPO's pairs, self-generated sources."""
    hp = spec.hyperparameters
    n = sum(s.size for s in spec.data.sources) * hp.num_generations * hp.max_completion_length \
        if spec.algorithm == "dpo" else 0
    for src in spec.data.sources:
        gen = getattr(src, "self_generated", None)
        if gen is not None:
            n += src.size * gen.samples_per_prompt * gen.max_completion_length
    return n


def model_factor(model: CostModel, name: str, algorithm: str | None = None, prompt_format: str = "raw") -> float:
    """Seconds per step of base model ``name`` relative to tiny-s: this machine's measured profile for the
    algorithm and prompt format (chat prompts are several times longer), the cost model's, the registry
    entry's (``base_models.<name>.cost_factor``), or the largest."""
    measured = model.profile.get(name, {})
    for key in ([f"{algorithm}:{prompt_format}"] if prompt_format != "raw" else []) + [algorithm]:
        if algorithm and measured.get(key):
            return float(measured[key])
    if name in model.model_factors:
        return float(model.model_factors[name])
    from agent_trainer.inner_loop.models.registry import BASE_MODELS

    info = BASE_MODELS.get(name)
    if info is not None and info.cost_factor is not None:
        return float(info.cost_factor)
    return float(max(model.model_factors.values()))


def estimate_cost(spec, model: CostModel | None = None, steps: int | None = None,
                  prompt_format: str = "raw") -> CostEstimate:
    """Estimate the cost of a JobSpec; ``steps`` overrides ``max_steps``; ``prompt_format``: the task's."""
    model = model or CostModel()
    hp = spec.hyperparameters
    steps = hp.max_steps if steps is None else steps
    factor = model_factor(model, spec.base_model, spec.algorithm, prompt_format)
    if spec.algorithm == "grpo":
        step = model.grpo_step_s + hp.batch_size * hp.max_completion_length * model.grpo_token_s
        lora = model.lora_factor_grpo if spec.peft else 1.0
        formula = f"grpo, {hp.batch_size} completions x {hp.max_completion_length} tokens"
    elif spec.algorithm == "dpo":
        step = model.dpo_step_s + hp.batch_size * model.dpo_pair_s
        lora = model.lora_factor_dpo if spec.peft else 1.0
        formula = f"dpo, {hp.batch_size} pairs"
    else:
        step = model.sft_step_s + hp.batch_size * model.sft_sequence_s
        lora = model.lora_factor_sft if spec.peft else 1.0
        formula = f"sft, batch {hp.batch_size}"
    step *= factor * lora
    formula += f", {spec.base_model} x{factor:g}" + (f", lora x{lora:g}" if spec.peft else "")
    tokens = sampled_tokens(spec)
    sampling = tokens * model.sample_token_s * factor
    if tokens:
        formula += f", sampling {tokens} tokens"
    seconds = model.startup_s + steps * step + sampling
    return CostEstimate(seconds=round(seconds, 2), usd=round(seconds / 3600 * model.usd_per_hour, 6), steps=steps,
                        step_seconds=round(step, 5), startup_seconds=model.startup_s,
                        formula=formula + f", ${model.usd_per_hour}/h", sampling_seconds=round(sampling, 2))


def estimate_job(spec, model: CostModel | None = None, steps: list[int] | None = None,
                 prompt_format: str = "raw") -> CostEstimate:
    """Estimate a whole job, stages included (``steps``: per stage); one start-up, every stage's steps and sampling."""
    model = model or CostModel()
    views = spec.stage_specs()
    steps = steps or [v.hyperparameters.max_steps for v in views]
    parts = [estimate_cost(v, model, n, prompt_format) for v, n in zip(views, steps)]
    if len(parts) == 1:
        return parts[0]
    total_steps = sum(p.steps for p in parts)
    train_s = sum(p.steps * p.step_seconds for p in parts)
    sampling = sum(p.sampling_seconds for p in parts)
    seconds = model.startup_s + train_s + sampling
    formula = " | ".join(f"stage {n}: {p.steps} x {p.step_seconds:.3f} s ({p.formula.rsplit(', $', 1)[0]})"
                         for n, p in enumerate(parts, 1))
    return CostEstimate(seconds=round(seconds, 2), usd=round(seconds / 3600 * model.usd_per_hour, 6),
                        steps=total_steps, step_seconds=round(train_s / max(1, total_steps), 5),
                        startup_seconds=model.startup_s, formula=formula + f", ${model.usd_per_hour}/h",
                        sampling_seconds=round(sampling, 2))


# --- measured profiles (at-models calibrate) ------------------------------------------------------
PROFILE_FILE = "cost_profiles.json"


def machine_key(device: str = "cpu") -> str:
    """Which machine a profile belongs to: the device kind, the processor and its core count (and GPU name)."""
    import os
    import platform

    key = f"{platform.machine()}-{os.cpu_count()}cpu"
    if device != "cpu":
        try:
            import torch

            if torch.cuda.is_available():
                key += "-" + torch.cuda.get_device_name(0).replace(" ", "_")
        except ImportError:
            pass
    return f"{device}-{key}"


def load_profile(machine: str, cache_dir=None) -> dict:
    """``model -> {algorithm: factor}`` measured on ``machine`` ({} when none was)."""
    import json

    from agent_trainer.paths import cache_dir as default_cache_dir

    path = default_cache_dir(cache_dir) / PROFILE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {m: {a: float(f) for a, f in per.get("factors", {}).items()} for m, per in data.get(machine, {}).items()}


def save_profile(machine: str, model: str, factors: dict, measured: dict, cache_dir=None) -> None:
    """Record a model's measured factors (and what was measured) for ``machine`` in the cache."""
    import json
    import os
    import tempfile
    import time

    from agent_trainer.paths import cache_dir as default_cache_dir

    root = default_cache_dir(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / PROFILE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data.setdefault(machine, {})[model] = {"factors": factors, "measured": measured,
                                           "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    fd, tmp = tempfile.mkstemp(prefix=f".{PROFILE_FILE}.", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
