"""Strategy labels s = (p, d, g) of executed jobs, read from what ran (``result.json``'s ``ran``), the switch
detector and switch metrics.

    >>> from agent_trainer.outer_loop.strategy.strategy import label, switches, sequence_metrics
    >>> a = label({"stages": [{"algorithm": "sft", "peft": "full", "data_source": "curated", "steps": 50}]})
    >>> a                                    # Strategy(p='full_sft', d='curated', g='single')
    >>> b = label({"stages": [{"algorithm": "grpo", "peft": "lora", "data_source": "curated", "steps": 40}]})
    >>> switches([a, a, b])                  # [Switch(position=3, components=('p',))]
    >>> sequence_metrics([a, a, b])          # switch_rate 0.5, switch_p 1, first_switch 3, ...

The components' values and what counts as a switch: docs/strategy.md, "Strategy labels and switches".
``ran_of`` derives ``ran`` from a job snapshot for a result that lacks it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

COMPONENTS = ("p", "d", "g")
# (algorithm, adapter) -> method label; "lora" stands for any adapter.
METHODS = {
    ("sft", "full"): "full_sft", ("sft", "lora"): "peft_sft",
    ("grpo", "full"): "rl", ("grpo", "lora"): "peft_rl",
    ("dpo", "full"): "preference", ("dpo", "lora"): "peft_preference",
    ("distill", "full"): "distillation", ("distill", "lora"): "peft_distillation",
}
DATA_SOURCES = ("curated", "self_generated", "mixed", "agent")
NOT_RUN = ("invalid", "over_budget")


@dataclass(frozen=True)
class Strategy:
    """s = (p, d, g) of one executed job."""

    p: str
    d: str
    g: str

    def __str__(self) -> str:
        return f"{self.p}/{self.d}/{self.g}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Switch:
    """Executed job number ``position`` (1-based) differs from the executed job before it in ``components``."""

    position: int
    components: tuple[str, ...]
    before: Strategy
    after: Strategy


def method(algorithm: str, peft: str | None) -> str:
    """``(sft, lora)`` -> ``peft_sft``; see the module docstring for the table."""
    algorithm = str(algorithm).lower()
    adapter = "full" if peft in (None, "", "full", "none", False) else "lora"
    return METHODS.get((algorithm, adapter), algorithm if adapter == "full" else f"peft_{algorithm}")


def _stages(ran: Any) -> list[dict[str, Any]]:
    if not isinstance(ran, dict) or not isinstance(ran.get("stages"), list):
        return []
    return [s for s in ran["stages"] if isinstance(s, dict) and int(s.get("steps") or 0) > 0]


def label(ran: dict[str, Any] | None) -> Strategy | None:
    """The strategy of a job from its ``ran`` record; None when no stage trained (not an executed job)."""
    stages = _stages(ran)
    if not stages:
        return None
    last = stages[-1]
    p = method(last.get("algorithm", "?"), last.get("peft"))
    sources = [str(s.get("data_source") or "curated") for s in stages]
    d = sources[0] if len(set(sources)) == 1 else "mixed"
    g = "single" if len(stages) == 1 else ">".join(str(s.get("algorithm", "?")).lower() for s in stages)
    return Strategy(p, d, g)


def diff(a: Strategy, b: Strategy) -> tuple[str, ...]:
    """Components in which two labels differ (empty: same strategy)."""
    return tuple(c for c in COMPONENTS if getattr(a, c) != getattr(b, c))


def executed(labels: Iterable[Strategy | None]) -> list[Strategy]:
    """The labels of executed jobs, in order (jobs without a label dropped)."""
    return [x for x in labels if x is not None]


def switches(labels: Sequence[Strategy | None]) -> list[Switch]:
    """Every switch between adjacent executed jobs."""
    seq = executed(labels)
    out = []
    for i in range(1, len(seq)):
        comps = diff(seq[i - 1], seq[i])
        if comps:
            out.append(Switch(position=i + 1, components=comps, before=seq[i - 1], after=seq[i]))
    return out


def sequence_metrics(labels: Sequence[Strategy | None]) -> dict[str, Any]:
    """Switch metrics of one job sequence (an episode).

    ``switch_rate`` = switches / adjacent executed pairs (None without a pair); ``switch_p|d|g`` =
    switches that changed that component (one switch may change several); ``first_switch`` = the
    executed-job number at which the strategy first changed (2 = the second job already differs;
    None = never switched).
    """
    seq = executed(labels)
    sw = switches(seq)
    pairs = max(0, len(seq) - 1)
    m: dict[str, Any] = {"executed": len(seq), "pairs": pairs, "switches": len(sw),
                         "switch_rate": len(sw) / pairs if pairs else None,
                         "first_switch": sw[0].position if sw else None}
    for c in COMPONENTS:
        m[f"switch_{c}"] = sum(c in s.components for s in sw)
    m["sequence"] = [str(x) for x in seq]
    return m


def aggregate(per_sequence: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pooled switch metrics over many sequences (a run, or every run of one agent configuration).

    ``switch_rate`` pools pairs (sum of switches / sum of pairs, the paper's "2.1% of adjacent runs");
    ``share_switch_<c>`` is the share of switches that changed component c; ``first_switch_mean``
    averages over sequences that switched; ``switched_share`` = sequences with a switch / sequences
    with at least one pair.
    """
    pairs = sum(m["pairs"] for m in per_sequence)
    n_sw = sum(m["switches"] for m in per_sequence)
    firsts = [m["first_switch"] for m in per_sequence if m.get("first_switch") is not None]
    with_pairs = [m for m in per_sequence if m["pairs"]]
    out: dict[str, Any] = {
        "sequences": len(per_sequence), "executed": sum(m["executed"] for m in per_sequence), "pairs": pairs,
        "switches": n_sw, "switch_rate": n_sw / pairs if pairs else None,
        "first_switch_mean": sum(firsts) / len(firsts) if firsts else None,
        "switched_share": sum(m["switches"] > 0 for m in with_pairs) / len(with_pairs) if with_pairs else None,
    }
    for c in COMPONENTS:
        k = sum(m[f"switch_{c}"] for m in per_sequence)
        out[f"switch_{c}"] = k
        out[f"share_switch_{c}"] = k / n_sw if n_sw else None
    return out


def run_metrics(strategies: Sequence[dict[str, Any]], prefix: str = "") -> dict[str, float]:
    """Switch metrics pooled over episodes, from their ``EpisodeResult.strategy`` dicts (a training step, a run)."""
    return numeric_metrics(aggregate([s for s in strategies if "pairs" in s]), prefix)


def numeric_metrics(m: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of a metrics dict (for MLflow: None and lists dropped)."""
    return {prefix + k: float(v) for k, v in m.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}


# --- ``ran`` of a result --------------------------------------------------------------------


def ran_of(result: Any, job_dir: str | Path | None = None) -> dict[str, Any]:
    """The ``ran`` record of a job result (a ``JobResult`` or its ``result.json`` dict).

    Uses the result's own ``ran`` when it has one; otherwise derives it from the job snapshot's
    ``job.yaml`` (``job_dir``, default the result's ``job_dir``) and the steps the result reports.
    A job that was refused (invalid, over budget) or trained no step has stages with ``steps: 0``.
    """
    get = result.get if isinstance(result, dict) else (lambda k, default=None: getattr(result, k, default))
    own = get("ran")
    status, steps = get("status"), int(get("steps") or 0)
    # The result's own record, unless it has none or an empty one for a job that trained steps: derive it then.
    if isinstance(own, dict) and isinstance(own.get("stages"), list) and (
            own["stages"] or status in NOT_RUN or steps == 0):
        return own
    job_dir = Path(job_dir or get("job_dir") or ".")
    try:
        raw = yaml.safe_load((job_dir / "job.yaml").read_text())
    except (OSError, yaml.YAMLError):
        raw = None
    if not isinstance(raw, dict):
        return {"stages": [], "derived": True}
    blocks = raw["stages"] if isinstance(raw.get("stages"), list) and raw["stages"] else [raw]
    stages = []
    left = 0 if status in NOT_RUN else steps
    for block in blocks:
        block = block if isinstance(block, dict) else {}
        algorithm = str(block.get("algorithm") or raw.get("algorithm") or "?").lower()
        peft = block["peft"] if "peft" in block else (raw.get("peft") if block is raw else None)
        data = block.get("data") if isinstance(block.get("data"), dict) else raw.get("data")
        planned = _planned_steps(block, raw)
        # A crashed multi-stage job reports its total steps: fill the stages in order.
        done = min(left, planned) if len(blocks) > 1 and planned else left
        left = max(0, left - done)
        stages.append({"algorithm": algorithm, "peft": "lora" if peft else "full",
                       "data_source": data_source(data, algorithm), "steps": done})
    return {"stages": stages, "derived": True}


def _planned_steps(block: dict, raw: dict) -> int:
    hp = block.get("hyperparameters") if isinstance(block.get("hyperparameters"), dict) else {}
    try:
        return int(hp.get("max_steps") or 0)
    except (TypeError, ValueError):
        return 0


def data_source(data: Any, algorithm: str = "sft") -> str:
    """``curated`` | ``self_generated`` | ``agent`` | ``mixed`` of a job's (or a stage's) ``data`` block.

    Library sources are curated unless marked ``self_generated``; a data file is the agent's; a DPO
    stage on library prompts trains on the model's own ranked samples (self-generated)."""
    if not isinstance(data, dict):
        return "curated"
    kinds = set()
    for src in data.get("sources") or []:
        if isinstance(src, dict):
            own = src.get("self_generated") not in (None, False) or algorithm == "dpo"
            kinds.add("self_generated" if own else "curated")
    if data.get("file"):
        kinds.add("agent")
    if not kinds:
        return "curated"
    return kinds.pop() if len(kinds) == 1 else "mixed"


def job_labels(jobs_dir: str | Path) -> list[dict[str, Any]]:
    """``[{job, status, ran, label, hidden_score, base_model, ...}]`` of every job in an episode's ``jobs/``
    (``result.json``; job 1 = ``00``)."""
    import json

    out = []
    for res_path in sorted(Path(jobs_dir).glob("*/output/result.json")):
        try:
            res = json.loads(res_path.read_text())
        except (OSError, ValueError):
            continue
        ran = ran_of(res, res_path.parent.parent / "job")
        lab = label(ran) if res.get("status") not in NOT_RUN else None
        out.append({"job": int(res_path.parent.parent.name) + 1, "status": res.get("status"), "ran": ran,
                    "label": lab.as_dict() if lab else None, "hidden_score": res.get("hidden_score"),
                    "uplift": res.get("uplift"), "usd": res.get("usd"), "base_model": res.get("base_model")})
    return out


def from_dict(d: dict[str, str] | None) -> Strategy | None:
    """A label back from its ``as_dict`` form (summary.json)."""
    return Strategy(d["p"], d["d"], d["g"]) if d else None
