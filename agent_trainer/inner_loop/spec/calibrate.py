"""Cost profiles: how fast a base model trains on this machine, measured, for the validation's estimates.

    at-models calibrate model=smollm2-135m          # ~55 min for SmolLM2 on 2 cores (~3 min for tiny-m)
    >>> from agent_trainer.inner_loop.spec.calibrate import calibrate
    >>> calibrate("smollm2-135m")["factors"]         # {"sft": ..., "grpo": ..., "sft:chat": ..., ...}

Times short SFT-, GRPO- and DPO-LoRA jobs (raw and chat format) at two batch sizes against the tiny-s
coefficients, fits a factor for a step's fixed cost and one for its rows (``sft``, ``sft/row``, ...), GRPO's for a
completion's tokens and its prompt's (``grpo/token``, ``grpo/prompt``: two more jobs) and one for sampling
(``sample``, from DPO's pairs), and stores them in ``<cache>/cost_profiles.json``, which
``CostModel.measured`` reads: docs/real_models.md, "Costs per machine".
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import yaml

from agent_trainer.inner_loop.spec.cost import (CAL_COMPLETION_TOKENS, CAL_LONG_COMPLETION_TOKENS, CostModel,
                                                machine_key, row_tokens, sampled_tokens, save_profile, step_parts,
                                                stored_measurements)

# The calibration jobs (LoRA, as real models are trained here); steps after the first are timed. Each runs at
# two batch sizes, so a step's fixed cost and its cost per row (completion) get a factor each.
JOBS = {
    "sft": {"algorithm": "sft", "peft": {"r": 16, "alpha": 32},
            "hyperparameters": {"learning_rate": 1e-4, "batch_size": 16, "max_steps": 12}},
    "grpo": {"algorithm": "grpo", "peft": {"r": 16, "alpha": 32},
             "hyperparameters": {"learning_rate": 1e-5, "batch_size": 16, "num_generations": 4,
                                 "max_completion_length": CAL_COMPLETION_TOKENS, "max_steps": 4},
             "reward": {"functions": [{"name": "numeric_closeness"}]}},
    "dpo": {"algorithm": "dpo", "peft": {"r": 16, "alpha": 32},
            "hyperparameters": {"learning_rate": 1e-4, "batch_size": 16, "num_generations": 4,
                                "max_completion_length": 8, "max_steps": 6},
            "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 128}]}},
}
# The second batch size: DPO's rows are pairs (two sequences each, and the reference's forward pass).
LARGE = {"sft": {"batch_size": 64, "max_steps": 6}, "grpo": {"batch_size": 64, "max_steps": 3},
         "dpo": {"batch_size": 32, "max_steps": 3}}
# GRPO's extra jobs, the small batch with one thing changed each, so a completion's cost splits into its tokens
# (4x the completion tokens), its prompt's (every prompt opened by PROMPT_PAD: 31 more tokens of the project's
# tokenizer) and the rest (the step's work per completion): (suffix, hyperparameters changed, prompt prefix).
EXTRA = {"grpo": [("/token", {"max_completion_length": CAL_LONG_COMPLETION_TOKENS}, ""), ("/prompt", {}, "pad")]}
PROMPT_PAD = "Work out the expression below and answer with the final number only, no words. "


class CalibrationError(RuntimeError):
    """A calibration job did not finish (out of memory, a crash): what was measured before it is kept."""


FIXED_FLOOR = 0.01   # the fixed-cost factor of a model whose steps are all rows (a factor of 0 reads as none) ...
FLOOR_SHARE = 0.01   # ... at most this share of the machine's own factor: on a machine 250x the reference (a GPU,
                     # factors ~0.004) a floor of 0.01 would price the floored part 2.5x what it costs


def floor_for(factor: float) -> float:
    """The floor of a factor that fits at or below 0, beside ``factor`` (the machine's row factor, or its ratio
    on the job the part was added to): ``FIXED_FLOOR``, or ``FLOOR_SHARE`` of ``factor`` when that is smaller."""
    return min(FIXED_FLOOR, _sig(FLOOR_SHARE * factor)) if factor > 0 else FIXED_FLOOR


def _sig(x: float, digits: int = 3) -> float:
    """``x`` to ``digits`` significant digits: a factor keeps its precision on a machine 100x the reference
    (0.00412), a step's seconds on a GPU (0.004127)."""
    return float(f"{x:.{digits}g}")


def fit_factors(small: tuple[float, float, float], large: tuple[float, float, float]) -> tuple[float, float]:
    """(factor of the fixed cost, factor of the rows' cost) from two timed jobs, each ``(fixed, rows, measured)``:
    the reference's fixed and row seconds of a step (LoRA included) and the seconds it took here. When the
    larger job costs more than its rows alone explain (a large model, whose step is all rows: the fixed part
    fits negative), the rows carry the step: the row factor closest to both timings and its floor (``floor_for``). When
    the two do not separate otherwise (noise: the larger job no slower), one factor, the larger job's ratio,
    prices both."""
    (f1, r1, m1), (f2, r2, m2) = small, large
    if r2 > r1:
        per_row = (m2 - m1) / (r2 - r1)
        fixed = (m1 - r1 * per_row) / f1 if f1 else 0.0
        if per_row > 0 and fixed > 0:
            return _sig(fixed), _sig(per_row)
        if per_row > 0:
            row = _sig((m1 * r1 + m2 * r2) / (r1 * r1 + r2 * r2))
            return floor_for(row), row
    one = _sig(m2 / (f2 + r2))
    return one, one


def fit_part_factor(base: tuple[float, float, float], changed: tuple[float, float, float]) -> float:
    """The factor of one part of a GRPO completion (its tokens, its prompt's) from two timed jobs at the same batch
    size, ``(fixed, rows, measured)`` as ``fit_factors``'s, the second with that part longer: what the extra tokens
    cost here against what they cost the reference (when the second job was no slower: noise, or tokens that cost
    nothing next to the rest, the floor beside the base job's ratio, ``floor_for``)."""
    (f1, r1, m1), (_, r2, m2) = base, changed
    floor = floor_for(m1 / (f1 + r1)) if f1 + r1 > 0 else FIXED_FLOOR
    return _sig(max(floor, (m2 - m1) / (r2 - r1))) if r2 > r1 else floor


def _data(job: dict, family: str, pad: str = "") -> dict:
    """A calibration job with its rows drawn from ``family``: 400 of them, or the job's own count; with ``pad``,
    those rows from the job folder's ``data.jsonl`` (``_rows``)."""
    size = job.get("data", {}).get("sources", [{}])[0].get("size", 400)
    sources = {"sources": [{"family": family, "seed": 1, "size": size}]}
    return {**job, "data": {"file": "data.jsonl"} if pad else sources}


def _rows(job: dict, family: str, pad: str = "") -> list[dict]:
    """The rows of a calibration job (``_data`` without ``pad``), each prompt opened by ``PROMPT_PAD`` when
    ``pad``."""
    from agent_trainer.inner_loop.spec.jobspec import JobSpec
    from agent_trainer.inner_loop.train.data import build_rows_with_origins

    spec = JobSpec.model_validate({"base_model": "tiny-s", "seed": 0, **_data(job, family)},
                                  context={"task_family": family})
    rows = build_rows_with_origins(spec, None, family)[0]
    return [{**r, "prompt": PROMPT_PAD + r["prompt"]} for r in rows] if pad else rows


def _timed_job(name: str, model_dir: Path, job: dict, device: str, folder: Path, fmt=None, threads: int | None = None,
               family: str = "calc_chain", pad: str = "") -> tuple[float, int, float, float]:
    """(seconds of the median step after the first, steps timed, CPU seconds per wall second over those steps,
    seconds of sampling before training) of one calibration job, run as jobs run (its own process)."""
    from agent_trainer.inner_loop.run.worker import Training, run_worker
    from agent_trainer.inner_loop.train.train import TRAIN_LOG

    job_dir = folder / "job"
    job_dir.mkdir(parents=True)
    spec = {"base_model": name, "seed": 0, **_data(job, family, pad)}
    (job_dir / "job.yaml").write_text(yaml.safe_dump(spec))
    if pad:
        (job_dir / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(job, family, pad)))
    steps = job["hyperparameters"]["max_steps"]
    run = run_worker(Training(job_dir, model_dir, family, folder / "out", max_steps=steps, threads=threads,
                              device=device, fmt=fmt), deadline_s=7200, progress=False)
    if run.status.get("status") != "ok":
        raise CalibrationError(f"the calibration job ({job['algorithm']}, {fmt.kind if fmt else 'raw'} format, batch "
                               f"{job['hyperparameters']['batch_size']}) ended {run.status.get('status')}: "
                               f"{run.status.get('detail')}")
    log = [json.loads(line) for line in (folder / "out" / TRAIN_LOG).read_text().splitlines() if line.strip()]
    times = {r["step"]: (r["seconds"], r.get("cpu_seconds", 0.0)) for r in log if "seconds" in r}
    first, last = min(times), max(times)
    wall, cpu = times[last][0] - times[first][0], times[last][1] - times[first][1]
    # The median step (a pause of the process, a collection, lands on one step, not on every step's price).
    logged = sorted(times)
    median = statistics.median((times[b][0] - times[a][0]) / (b - a) for a, b in zip(logged, logged[1:]))
    generation = folder / "out" / "generation.json"
    sampling = sum(g["seconds"] for g in json.loads(generation.read_text())) if generation.is_file() else 0.0
    return median, last - first, cpu / wall if wall > 0 else 0.0, sampling


def calibrate(name: str, cache_dir=None, device: str = "cpu", progress: bool = True,
              threads: int | None = None, family: str = "calc_chain", algorithms=None, formats=None,
              missing_only: bool = False) -> dict:
    """Measure model ``name``'s factors here (sft, grpo, dpo and sampling, and all again in the chat format when
    its tokenizer has a chat template; ``algorithms`` and ``formats``: those only) on rows of ``family`` (those
    of the jobs to price), store them in the cache's profile (over what it held), return them. A factor is per
    token: the rows' lengths are priced first (``cost.row_tokens``), so rows of another length reuse it.
    ``missing_only``: time only the jobs the stored profile has no seconds for (a point a newer version fits) and
    fit them with the stored ones."""
    from transformers import AutoTokenizer

    from agent_trainer.evaluation.prompts import for_family
    from agent_trainer.inner_loop.models.registry import resolve_model

    model_dir = resolve_model(name, cache_dir=cache_dir, progress=progress)
    has_chat = bool(AutoTokenizer.from_pretrained(model_dir).chat_template)
    if formats and "chat" in formats and not has_chat:
        raise CalibrationError(f"{name}'s tokenizer has no chat template: calibrate it with formats=[raw]")
    formats = list(formats or ["raw"] + (["chat"] if has_chat else []))
    factors, measured = {}, {}
    stored = stored_measurements(machine_key(device), name, cache_dir) if missing_only else {}
    for kind in formats:
        suffix = "" if kind == "raw" else f":{kind}"
        for algorithm, job in JOBS.items():
            if algorithms and algorithm not in algorithms:
                continue
            key = algorithm + suffix
            timings = {}
            for size, hp, pad in _sizes(algorithm):
                if key + size in stored:
                    measured[key + size] = old = stored[key + size]
                    timings[size] = (old["seconds_per_step"], old.get("sampling_seconds", 0.0))
                    continue
                sized = _data({**job, "hyperparameters": hp}, family)
                with tempfile.TemporaryDirectory(prefix=f"calibrate-{algorithm}-") as tmp:
                    try:
                        step_s, timed, cpu_share, sampling_s = _timed_job(
                            name, model_dir, sized, device, Path(tmp), for_family(family, kind), threads, family, pad)
                    except CalibrationError as e:
                        done = ", ".join(factors) or "none"
                        raise CalibrationError(f"{e}; the factors measured before it are stored ({done})") from None
                # Fitted from the seconds as stored, so a refit of the profile gives these factors again.
                step_s, sampling_s = _sig(step_s, 4), _sig(sampling_s, 4)
                timings[size] = (step_s, sampling_s)
                measured[key + size] = {"seconds_per_step": step_s, "steps_timed": timed,
                                        "batch_size": hp["batch_size"], "cpu_share": round(cpu_share, 2),
                                        **({"completion_tokens": hp["max_completion_length"]}
                                           if algorithm == "grpo" else {}),
                                        **({"sampling_seconds": sampling_s} if sampling_s else {}),
                                        **({"longer_prompts": True} if pad else {})}
            factors.update(_fitted(algorithm, suffix, timings, family))
            # Stored as each algorithm is done (over what was stored before): a job that cannot finish (out of
            # memory on a large model) loses its own factors only.
            save_profile(machine_key(device), name, factors, measured, cache_dir)
    return {"machine": machine_key(device), "factors": factors, "measured": measured,
            "busy": busy_warning(measured, device)}


def _sizes(algorithm: str) -> list[tuple[str, dict, str]]:
    """A calibration job's two batch sizes, and GRPO's extra jobs: (the suffix of its key, its hyperparameters,
    its prompts' prefix or "")."""
    small = JOBS[algorithm]["hyperparameters"]
    return [("", small, ""), ("/row", {**small, **LARGE[algorithm]}, "")] + \
        [(suffix, {**small, **hp}, pad) for suffix, hp, pad in EXTRA.get(algorithm, [])]


def _fitted(algorithm: str, suffix: str, timings: dict[str, tuple[float, float]], family: str) -> dict:
    """The factors of ``algorithm`` in a format (``suffix``: "" or ":chat") from its jobs' timings, by ``_sizes``'
    suffix (``timings``: suffix -> ``(seconds a step, seconds of sampling)``): the step's two factors, GRPO's
    completion tokens' and prompt tokens' when their jobs were timed, and, for a job that samples (DPO's pairs),
    the sampling's."""
    points, sampling = {}, []
    for size, hp, pad in _sizes(algorithm):
        if size not in timings:
            continue
        step_s, sampling_s = timings[size]
        fixed, rows, sampled = _reference({**JOBS[algorithm], "hyperparameters": hp}, family, pad)
        points[size] = (fixed, rows, step_s)  # tiny-s's, by the coefficients; and here
        if sampled:
            sampling.append(sampling_s / sampled)
    out = dict(zip((algorithm + suffix, algorithm + suffix + "/row"), fit_factors(points[""], points["/row"])))
    for size in ("/token", "/prompt"):
        if size in points:
            out[algorithm + suffix + size] = fit_part_factor(points[""], points[size])
    if sampling:
        out["sample" + suffix] = _sig(sum(sampling) / len(sampling))
    return out


def _reference(job: dict, family: str, pad: str = "") -> tuple[float, float, float]:
    """What a calibration job's step costs tiny-s on the reference machine, by the coefficients: (its fixed
    seconds, its rows' seconds, LoRA included) and the seconds of its sampling (DPO's pairs; 0 without)."""
    from agent_trainer.inner_loop.spec.jobspec import JobSpec

    base = CostModel()
    spec = JobSpec.model_validate({"base_model": "tiny-s", "seed": 0, **_data(job, family)},
                                  context={"task_family": family})
    fixed, rows, lora, _ = step_parts(spec, base, row_tokens(_rows(job, family, pad)))
    return fixed * lora, rows * lora, sampled_tokens(spec) * base.sample_token_s


def refit(name: str, cache_dir=None, device: str = "cpu", family: str = "calc_chain") -> dict:
    """``name``'s factors fitted again from the seconds its stored profile holds, no job run: after the fit or
    the reference coefficients changed (``at-models calibrate refit=true``). Stored and returned as
    ``calibrate``'s."""
    measured = stored_measurements(machine_key(device), name, cache_dir)
    if not measured:
        raise CalibrationError(f"no cost profile of {name} on {machine_key(device)} to fit again: "
                               f"at-models calibrate model={name}")
    factors = {}
    for key in sorted(k for k in measured if "/" not in k and f"{k}/row" in measured):
        algorithm, _, kind = key.partition(":")
        timings = {size: (m["seconds_per_step"], m.get("sampling_seconds", 0.0))
                   for size, _, _ in _sizes(algorithm) if (m := measured.get(key + size))}
        factors.update(_fitted(algorithm, f":{kind}" if kind else "", timings, family))
    save_profile(machine_key(device), name, factors, {}, cache_dir)
    return {"machine": machine_key(device), "factors": factors, "measured": measured,
            "busy": busy_warning(measured, device)}


BUSY_SHARE = 0.5   # CPU seconds per wall second under which a CPU job shared its cores with other work


def busy_warning(measured: dict, device: str = "cpu") -> str | None:
    """A line when a CPU calibration job ran less than ``BUSY_SHARE`` of the wall clock on the CPU: other work
    took its cores, so its seconds (and the factors from them) are too high for this machine."""
    if device != "cpu":
        return None
    busy = {k: m["cpu_share"] for k, m in measured.items() if m.get("cpu_share", 1.0) < BUSY_SHARE}
    if not busy:
        return None
    shares = ", ".join(f"{k} {v:.2f}" for k, v in busy.items())
    return (f"the machine was busy: the calibration jobs ran on the CPU only part of the time (CPU seconds per "
            f"wall second: {shares}; a job alone runs at 1 or more), so these factors price this machine too "
            f"high; rerun at-models calibrate when nothing else runs")
