"""Cost model of an inner job: its compute and USD, estimated before the job runs.

    estimate_cost(spec, CostModel()).summary()     # '48 s, $0.0013 (150 steps, ...)'
    CostModel.measured("cpu")                      # with this machine's factors (at-models calibrate)
    estimate_job(spec, model, wall=True)           # the seconds this machine is expected to take

A linear model: start-up, plus steps times a per-step cost by algorithm, model and LoRA, plus
sampling; ``estimate_job`` prices a multi-stage job. Its unit is the compute second: a second of the
reference machine (the project's 2-core CPU box) under the package's coefficients and reference
profile (``CostModel.profile``). A job's compute is the same on every machine and under any load:
budgets, admission and the staged reward's speed stage read it. ``wall=True`` applies this machine's
measured factors (``CostModel.machine``) instead, for the wall-clock safety cap only. The formula:
docs/inner_loop.md, "Cost model"; its calibration points: docs/results/2026-12-06-cost-model-coefficients.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# Slowdown per step relative to tiny-s, on the same hardware. A model from configuration brings its
# own (``base_models.<name>.cost_factor``); without one it is priced like the slowest model here.
DEFAULT_MODEL_FACTORS = {"tiny-s": 1.0, "tiny-m": 1.8, "smollm2-135m": 76.0, "qwen3-0.6b": 1200.0,
                         "qwen3-1.7b": 3500.0}
# Per algorithm and prompt format, as `at-models calibrate model=smollm2-135m` measured them on the project's
# 2-core CPU box (SFT-LoRA at batch 16: 1.71 s a step raw, 10.2 s chat, whose rows are 5-8x longer; GRPO-LoRA:
# 3.8 s, 14.8 s). A profile measured on the machine at hand replaces them.
DEFAULT_PROFILE = {"smollm2-135m": {"sft": 76.0, "grpo": 61.0, "dpo": 76.0, "sft:chat": 454.0, "grpo:chat": 237.0,
                                    "dpo:chat": 454.0}}


# Rows are priced per token, counted with the project's tokenizer (the shipped tiny models', the same bytes
# everywhere) whatever the base model: a model's factor carries its own tokenizer's ratio. The per-row and
# per-completion coefficients are for rows of the reference length, calc_chain's training rows (4,000 rows,
# seed 1); ``*_token_s`` prices each token a row is longer (or shorter) than that.
REF_ROW_TOKENS = 10.23      # prompt + answer
REF_PROMPT_TOKENS = 8.57    # prompt
# The completion lengths GRPO is calibrated at (``at-models calibrate``): a profile that timed both (``grpo/token``)
# prices each token a job's completions are longer or shorter than the first, up to the second; tokens beyond it
# at no less than the row factor (a model that stops early on the calibration's rows may not on a job's); one that
# timed longer prompts (``grpo/prompt``) each token its prompts are longer or shorter than the reference's.
CAL_COMPLETION_TOKENS, CAL_LONG_COMPLETION_TOKENS = 8, 32
# The LoRA rank the lora_factor_* coefficients were measured at; each rank above it costs ``lora_rank_s`` of a step
# more (a smaller rank costs no less: the adapter is a small part of a step there).
LORA_CAL_RANK = 16
MAX_SEQUENCE_TOKENS = 512   # TRL's max_length in every trainer config (inner_loop/train/config.py): longer is cut
# No token of the project's tokenizer holds more than 16 bytes of UTF-8, so no more than 16 characters (a test holds
# it): a text of MAX_SEQUENCE_TOKENS x MAX_TOKEN_BYTES bytes or more has at least MAX_SEQUENCE_TOKENS tokens without
# tokenizing it, and a shorter one is whole within that many characters. A row is counted so, and a long row costs
# its kept tokens at most, never its whole text (characters outside the vocabulary are one token a byte).
MAX_TOKEN_BYTES = 16
TOKENIZE_CHUNK = 2048       # texts tokenized at once: the encodings of one chunk live at a time, not the file's


@dataclass(frozen=True)
class RowTokens:
    """Mean tokens of a stage's rows (the project's tokenizer): ``prompt`` and ``row`` (prompt + answer)."""

    prompt: float = REF_PROMPT_TOKENS
    row: float = REF_ROW_TOKENS


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the linear cost model (see the module docstring); the per-row and per-completion ones
    are for rows of the reference length (``REF_ROW_TOKENS``, ``REF_PROMPT_TOKENS``), ``*_token_s`` add
    each token a row's prompt (GRPO) or whole row (SFT, DPO) is longer than that."""

    startup_s: float = 15.0
    grpo_step_s: float = 0.047
    grpo_token_s: float = 0.0000567          # per completion token
    grpo_prompt_token_s: float = 0.0000735   # per completion, per prompt token over REF_PROMPT_TOKENS
    sft_step_s: float = 0.0126
    sft_sequence_s: float = 0.00079
    sft_token_s: float = 0.0000423           # per row, per token over REF_ROW_TOKENS
    dpo_token_s: float = 0.0000536           # per pair, per token over REF_ROW_TOKENS (two sides)
    lora_factor_grpo: float = 1.15
    lora_factor_sft: float = 0.9             # LoRA SFT steps are cheaper than full ones on tiny-s
    dpo_step_s: float = 0.03
    dpo_pair_s: float = 0.003
    lora_factor_dpo: float = 1.2
    # Each LoRA rank over LORA_CAL_RANK, as a share of a step: r 256 against r 16 took 1.85x the step on SmolLM2
    # (SFT, all linear layers; quiet) and 1.56x on tiny-s (bench/cost_model.py --variants). Priced at the larger.
    lora_rank_s: float = 0.0035
    # GRPO with beta > 0 runs a reference model over every completion: 1.46x the step on SmolLM2 (quiet), ~1.23x on
    # tiny-m. Priced at the larger.
    grpo_kl_factor: float = 1.45
    sample_token_s: float = 0.0001
    usd_per_hour: float = 0.10
    model_factors: dict = field(default_factory=lambda: dict(DEFAULT_MODEL_FACTORS))
    # The reference profile: model -> {"sft"|"grpo"|"dpo"[":chat"]: factor}; wins over model_factors for that
    # algorithm and prompt format. Part of the compute unit: the same on every machine.
    profile: dict = field(default_factory=lambda: {m: dict(f) for m, f in DEFAULT_PROFILE.items()})
    # Measured on this machine (``at-models calibrate``), in the same shape: used for wall-clock estimates only
    # (``wall=True``: the safety cap), never for compute (``CostModel.measured`` reads the cache's profile).
    machine: dict = field(default_factory=dict)

    @classmethod
    def measured(cls, device: str = "cpu", cache_dir=None, **overrides) -> "CostModel":
        """The default coefficients, with this machine's measured profile (``at-models calibrate``), if any, for
        wall-clock estimates."""
        return cls(machine=load_profile(machine_key(device), cache_dir), **overrides)


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
    # Per stage: (seconds per step, sampling seconds); what the job's process counts its compute budget in.
    stages: list = field(default_factory=list)

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


def model_factor(model: CostModel, name: str, algorithm: str | None = None, prompt_format: str = "raw",
                 wall: bool = False) -> float:
    """Seconds per step of base model ``name`` relative to tiny-s: with ``wall``, this machine's measured
    profile first; then the reference profile for the algorithm and prompt format (chat prompts are several
    times longer), the cost model's factors, the registry entry's (``base_models.<name>.cost_factor``), or
    the largest."""
    return model_factors(model, name, algorithm, prompt_format, wall)[0]


class Factors(NamedTuple):
    """A base model's speed relative to tiny-s, per part of a step (``model_factors``)."""

    step: float                   # a step's fixed cost
    row: float                    # a row's or a completion's (GRPO: at CAL_COMPLETION_TOKENS)
    token: float | None = None    # GRPO: each completion token more or fewer (None: as the row)
    prompt: float | None = None   # GRPO: each prompt token over the reference's (None: as the row)


def model_factors(model: CostModel, name: str, algorithm: str | None = None, prompt_format: str = "raw",
                  wall: bool = False) -> Factors:
    """Base model ``name``'s ``Factors``. A profile that measured two batch sizes (``at-models calibrate``) stores
    the second as ``<algorithm>/row``, GRPO's longer completions and prompts as ``grpo/token`` and
    ``grpo/prompt``; otherwise all parts scale alike (``model_factor``'s order of sources)."""
    keys = ([f"{algorithm}:{prompt_format}"] if prompt_format != "raw" else []) + [algorithm]
    for profile in ([model.machine] if wall else []) + [model.profile]:
        measured = profile.get(name, {})
        for key in keys:
            if algorithm and measured.get(key):
                step = float(measured[key])
                part = {p: float(measured[f"{key}/{p}"]) if measured.get(f"{key}/{p}") else None
                        for p in ("token", "prompt")}
                return Factors(step, float(measured.get(f"{key}/row") or step), **part)
    if name in model.model_factors:
        factor = float(model.model_factors[name])
        return Factors(factor, factor)
    from agent_trainer.inner_loop.models.registry import BASE_MODELS

    info = BASE_MODELS.get(name)
    if info is not None and info.cost_factor is not None:
        return Factors(float(info.cost_factor), float(info.cost_factor))
    factor = float(max(model.model_factors.values()))
    return Factors(factor, factor)


def sample_factor(model: CostModel, name: str, prompt_format: str, default: float) -> float:
    """This machine's sampling speed for base model ``name`` relative to the reference's tiny-s (its profile's
    ``sample[:format]``, measured on DPO's pairs by ``at-models calibrate``); ``default`` without one."""
    measured = model.machine.get(name, {})
    for key in ([f"sample:{prompt_format}"] if prompt_format != "raw" else []) + ["sample"]:
        if measured.get(key):
            return float(measured[key])
    return default


def row_tokens(rows: list[dict], pairs: bool = False) -> RowTokens:
    """Mean tokens of ``rows`` with the project's tokenizer (the reference when none): ``prompt`` and ``row``, the
    prompt with what is trained after it: the ``answer``, or with ``pairs`` (DPO) the longer of a row's ``chosen``
    and ``rejected`` where it has both (a data file's pairs; sampled pairs are priced by their completion length),
    at most ``MAX_SEQUENCE_TOKENS`` a sequence, as the trainer cuts them."""
    if not rows:
        return RowTokens()
    cut = MAX_SEQUENCE_TOKENS * MAX_TOKEN_BYTES
    # Prompts whole (GRPO reads them uncut; the validation caps a prompt at 2,000 characters); a trained text of
    # ``cut`` bytes or more is at the cut without tokenizing, a shorter one is tokenized whole.
    prompts = [str(r.get("prompt", "")) for r in rows]
    fulls = [[p + t for t in _trained(r, pairs)] for p, r in zip(prompts, rows)]
    long = {t for texts in fulls for t in texts if len(t) * 4 >= cut and len(t.encode()) >= cut}
    count = token_counts([*prompts, *(t for texts in fulls for t in texts if t not in long)])
    count.update(dict.fromkeys(long, MAX_SEQUENCE_TOKENS))
    row = sum(min(MAX_SEQUENCE_TOKENS, max(count[t] for t in texts)) for texts in fulls)
    return RowTokens(prompt=round(sum(count[p] for p in prompts) / len(rows), 2), row=round(row / len(rows), 2))


def token_counts(texts: list[str]) -> dict[str, int]:
    """Tokens of each distinct text with the project's tokenizer, encoded ``TOKENIZE_CHUNK`` texts at a time (the
    encodings of a 20 MB data file at once took 3.1 GB; a chunk's are freed before the next is encoded)."""
    tok = _reference_tokenizer()
    distinct = list(dict.fromkeys(texts))   # a pool repeats items
    count: dict[str, int] = {}
    for at in range(0, len(distinct), TOKENIZE_CHUNK):
        chunk = distinct[at:at + TOKENIZE_CHUNK]
        count.update((t, len(e.ids)) for t, e in zip(chunk, tok.encode_batch(chunk, add_special_tokens=False)))
    return count


def _trained(row: dict, pairs: bool) -> list[str]:
    """What a row trains after its prompt: its answer, or (``pairs``) its chosen and rejected when it has both."""
    if pairs and isinstance(row.get("chosen"), str) and isinstance(row.get("rejected"), str):
        return [row["chosen"], row["rejected"]]
    return [str(row.get("answer", ""))]


_TOKENIZER = []


def _reference_tokenizer():
    """The project's tokenizer (``tokenizers``, from the shipped tiny-s; built from code when not shipped)."""
    if not _TOKENIZER:
        from importlib.util import find_spec
        from pathlib import Path

        from tokenizers import Tokenizer

        # The models package's folder found without running the package (it imports torch and transformers: ~6 s
        # of the parsing child's 8 for a small job); ``registry.SHIPPED_DIR`` is its ``shipped`` folder.
        models = find_spec("agent_trainer.inner_loop.models").submodule_search_locations[0]
        path = Path(models) / "shipped" / "tiny-s" / "tokenizer.json"
        if path.is_file():
            _TOKENIZER.append(Tokenizer.from_file(str(path)))
        else:
            from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

            _TOKENIZER.append(build_tokenizer().backend_tokenizer)
    return _TOKENIZER[0]


def step_parts(spec, model: CostModel, tokens: RowTokens | None = None) -> tuple[float, float, float, str]:
    """(fixed seconds, seconds of the rows or completions, the factor of the whole step (``step_scale``), formula)
    of one step of a single-stage spec on tiny-s under ``model``'s coefficients; a base model's factors scale the
    first two."""
    fixed, rows, formula = _unscaled_step(spec, model, tokens)
    return fixed, rows, step_scale(spec, model)[0], formula


def _unscaled_step(spec, model: CostModel, tokens: RowTokens | None) -> tuple[float, float, str]:
    """``step_parts`` without the step's factor."""
    hp = spec.hyperparameters
    tokens = tokens or RowTokens()
    longer, longer_prompt = tokens.row - REF_ROW_TOKENS, tokens.prompt - REF_PROMPT_TOKENS
    # A row or completion shorter than the reference costs less, never under half the reference's cost.
    if spec.algorithm == "grpo":
        fixed, rows = model.grpo_step_s, grpo_rows(model, hp.batch_size, hp.max_completion_length, longer_prompt)
        formula = f"grpo, {hp.batch_size} completions x {hp.max_completion_length} tokens"
    elif spec.algorithm == "dpo":
        per = model.dpo_pair_s
        fixed, rows = model.dpo_step_s, hp.batch_size * max(per / 2, per + longer * model.dpo_token_s)
        formula = f"dpo, {hp.batch_size} pairs"
    else:
        per = model.sft_sequence_s
        fixed, rows = model.sft_step_s, hp.batch_size * max(per / 2, per + longer * model.sft_token_s)
        formula = f"sft, batch {hp.batch_size}"
    return fixed, rows, formula


def step_scale(spec, model: CostModel) -> tuple[float, str]:
    """(the factor of a whole step, its part of the formula): the LoRA's ``lora_factor_<algorithm>`` (times its
    rank's share over ``LORA_CAL_RANK``) and GRPO's KL reference model's (beta > 0)."""
    scale, label = 1.0, ""
    if spec.peft:
        lora = {"grpo": model.lora_factor_grpo, "dpo": model.lora_factor_dpo}.get(spec.algorithm,
                                                                                  model.lora_factor_sft)
        rank = 1 + model.lora_rank_s * max(0, spec.peft.r - LORA_CAL_RANK)
        scale, label = lora * rank, f", lora x{lora:g}" + (f" x{rank:g} (rank {spec.peft.r})" if rank != 1 else "")
    if spec.algorithm == "grpo" and spec.hyperparameters.beta > 0:
        scale *= model.grpo_kl_factor
        label += f", KL reference x{model.grpo_kl_factor:g}"
    return scale, label


def grpo_rows(model: CostModel, completions: int, length: int, longer_prompt: float) -> float:
    """Seconds of ``completions`` GRPO completions of ``length`` tokens after prompts ``longer_prompt`` tokens
    longer than the reference's, on tiny-s by the coefficients (never under half a completion's token cost)."""
    per = length * model.grpo_token_s
    return completions * max(per / 2, per + longer_prompt * model.grpo_prompt_token_s)


def estimate_cost(spec, model: CostModel | None = None, steps: int | None = None,
                  prompt_format: str = "raw", wall: bool = False, tokens: RowTokens | None = None) -> CostEstimate:
    """Estimate the compute of a JobSpec (``wall``: this machine's seconds); ``steps`` overrides ``max_steps``;
    ``prompt_format``: the task's; ``tokens``: its rows' lengths (``row_tokens``; None: the reference length)."""
    model = model or CostModel()
    hp = spec.hyperparameters
    steps = hp.max_steps if steps is None else steps
    factor, per_row, per_token, per_prompt = model_factors(model, spec.base_model, spec.algorithm, prompt_format, wall)
    fixed, rows, formula = _unscaled_step(spec, model, tokens)
    lora, scale_label = step_scale(spec, model)
    if spec.algorithm == "grpo" and (per_token, per_prompt) != (None, None):
        # A completion of the calibration's length at the row factor, each completion token more or fewer at the
        # token factor, each prompt token over the reference's at the prompt factor (measured apart: on a large
        # model a completion's tokens cost far more than its prompt's, against the reference's ratio).
        per_token, per_prompt = per_token or per_row, per_prompt or per_row
        at_cal = grpo_rows(model, hp.batch_size, CAL_COMPLETION_TOKENS, 0.0) * per_row
        length = hp.max_completion_length
        more = hp.batch_size * (
            (min(length, CAL_LONG_COMPLETION_TOKENS) - CAL_COMPLETION_TOKENS) * model.grpo_token_s * per_token
            + max(0, length - CAL_LONG_COMPLETION_TOKENS) * model.grpo_token_s * max(per_token, per_row)
            + ((tokens or RowTokens()).prompt - REF_PROMPT_TOKENS) * model.grpo_prompt_token_s * per_prompt)
        step = (fixed * factor + max(at_cal / 4, at_cal + more)) * lora
        parts = (f" a step, x{per_row:g} a completion of {CAL_COMPLETION_TOKENS} tokens, x{per_token:g} a token "
                 f"more, x{per_prompt:g} a prompt token")
    else:  # one factor: (fixed + rows) x factor, so the reference's compute units stay bit for bit
        step = (fixed + rows) * (factor * lora) if per_row == factor else (fixed * factor + rows * per_row) * lora
        parts = f" a step, x{per_row:g} a row" if per_row != factor else ""
    formula += f", {spec.base_model} x{factor:g}{parts}{scale_label}"
    sampled = sampled_tokens(spec)
    sampling = sampled * model.sample_token_s * (sample_factor(model, spec.base_model, prompt_format, factor) if wall
                                                 else factor)
    if sampled:
        formula += f", sampling {sampled} tokens"
    seconds = model.startup_s + steps * step + sampling
    return CostEstimate(seconds=round(seconds, 2), usd=round(seconds / 3600 * model.usd_per_hour, 6), steps=steps,
                        step_seconds=round(step, 5), startup_seconds=model.startup_s,
                        formula=formula + f", ${model.usd_per_hour}/h", sampling_seconds=round(sampling, 2),
                        stages=[(round(step, 5), round(sampling, 2))])


def estimate_job(spec, model: CostModel | None = None, steps: list[int] | None = None,
                 prompt_format: str = "raw", wall: bool = False,
                 tokens: list[RowTokens] | None = None) -> CostEstimate:
    """Estimate a whole job's compute (``wall``: this machine's seconds), stages included (``steps``, ``tokens``:
    per stage); one start-up, every stage's steps and sampling."""
    model = model or CostModel()
    views = spec.stage_specs()
    steps = steps or [v.hyperparameters.max_steps for v in views]
    tokens = tokens or [None] * len(views)
    parts = [estimate_cost(v, model, n, prompt_format, wall, t) for v, n, t in zip(views, steps, tokens)]
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
                        sampling_seconds=round(sampling, 2), stages=[s for p in parts for s in p.stages])


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


def _profiles(cache_dir=None) -> dict:
    """The whole profile file, ``machine -> model -> {factors, measured, at}`` ({} when absent or unreadable)."""
    import json

    from agent_trainer.paths import cache_dir as default_cache_dir

    try:
        return json.loads((default_cache_dir(cache_dir) / PROFILE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def load_profile(machine: str, cache_dir=None) -> dict:
    """``model -> {algorithm: factor}`` measured on ``machine`` ({} when none was)."""
    return {m: {a: float(f) for a, f in per.get("factors", {}).items()}
            for m, per in _profiles(cache_dir).get(machine, {}).items()}


def stored_measurements(machine: str, model: str, cache_dir=None) -> dict:
    """What ``at-models calibrate`` measured of ``model`` on ``machine`` (seconds a step, batch size, ... per key;
    {} when nothing was)."""
    return dict(_profiles(cache_dir).get(machine, {}).get(model, {}).get("measured", {}))


def save_profile(machine: str, model: str, factors: dict, measured: dict, cache_dir=None) -> None:
    """Record a model's measured factors (and what was measured) for ``machine`` in the cache, over what was stored
    for it before: a key measured again is replaced, the others are kept (a calibration stores as it goes, and one
    that stops early loses only what it had not measured)."""
    import json
    import os
    import tempfile
    import time

    from agent_trainer.paths import cache_dir as default_cache_dir

    root = default_cache_dir(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / PROFILE_FILE
    data = _profiles(cache_dir)
    earlier = data.setdefault(machine, {}).get(model) or {}
    data[machine][model] = {"factors": {**earlier.get("factors", {}), **factors},
                            "measured": {**earlier.get("measured", {}), **measured},
                            "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    fd, tmp = tempfile.mkstemp(prefix=f".{PROFILE_FILE}.", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
