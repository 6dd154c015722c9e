"""The evaluator agent: after a job it predicts, evaluates, analyses and suggests; the adoption check.

    >>> ev = RuleEvaluator(min_gain=0.01)                    # offline heuristics
    >>> ev = LLMEvaluator(backend, model_name="tiny-agent")  # a second agent through any AgentBackend
    >>> e = ev.evaluate(history, base_dev=0.12, task=task)   # Evaluation(prediction, evaluation, analysis, suggestions)
    >>> adopted(e.suggestions[0], before=history[-1], after=next_job)

Suggestion types and targets, the adoption rule and the metrics: docs/strategy.md, "Evaluator agent".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from agent_trainer.config import EvaluatorConfig
from agent_trainer.outer_loop.episode.tools import check_arguments, tool_schema

EXECUTION_TARGETS = ("learning_rate", "max_steps", "batch_size", "num_generations", "warmup_ratio",
                     "lr_scheduler", "weight_decay", "base_model", "reward")
STRATEGY_TARGETS = ("algorithm", "data_source", "stage", "adapter")
NUMERIC_TARGETS = ("learning_rate", "max_steps", "batch_size", "num_generations", "warmup_ratio", "weight_decay")
HP_DEFAULTS = {"learning_rate": 5e-4, "max_steps": 100, "batch_size": 32, "num_generations": 8, "warmup_ratio": 0.0,
               "weight_decay": 0.0, "lr_scheduler": "constant"}
# Learning-rate ranges that worked on the tiny models (agent_trainer/outer_loop/skills/learning_rate.md).
GOOD_LR = {("sft", "full"): (1e-3, 3e-3), ("sft", "lora"): (2e-3, 5e-3), ("grpo", "full"): (2e-4, 6e-4),
           ("grpo", "lora"): (1e-3, 3e-3), ("dpo", "full"): (1e-4, 1e-3), ("dpo", "lora"): (5e-4, 3e-3)}
ALTERNATIVE = {"sft": "grpo", "grpo": "sft", "dpo": "sft", "distill": "sft"}


def suggestion_type(target: str) -> str | None:
    """``execution`` | ``strategy`` | None (unknown target)."""
    return "execution" if target in EXECUTION_TARGETS else "strategy" if target in STRATEGY_TARGETS else None


@dataclass
class Suggestion:
    type: str          # execution | strategy
    target: str
    value: Any
    text: str = ""


@dataclass
class JobRecord:
    """One submitted job as the steering layer keeps it (the spec, what ran, the agent-visible result)."""

    job: int                               # 1 = the episode's first job
    status: str
    spec: dict[str, Any]                   # job.yaml as written (raw)
    ran: dict[str, Any]
    label: Any = None                      # agent_trainer.outer_loop.strategy.strategy.Strategy | None
    dev_score: float | None = None
    visible: dict[str, Any] = field(default_factory=dict)
    hidden_score: float | None = None      # harness only: never shown to an agent or evaluator

    def brief(self) -> dict[str, Any]:
        return {"job": self.job, "status": self.status, "label": str(self.label) if self.label else None,
                "dev_score": self.dev_score, "hidden_score": self.hidden_score}


@dataclass
class Evaluation:
    job: int
    source: str                            # rule | llm
    prediction: float | None = None
    evaluation: str = ""
    analysis: str = ""
    suggestions: list[Suggestion] = field(default_factory=list)
    malformed: str = ""
    dropped: list[str] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """What the agent reads."""
        if self.malformed:
            return f"Evaluator after job {self.job}: no usable evaluation ({self.malformed})."
        lines = [f"Evaluator after job {self.job}: {self.evaluation}"]
        if self.analysis:
            lines.append(f"Analysis: {self.analysis}")
        if self.prediction is not None:
            lines.append(f"Prediction: next dev score {self.prediction:.3f}")
        for s in self.suggestions:
            lines.append(f"Suggestion ({s.type}): {s.target} -> {s.value}" + (f": {s.text}" if s.text else ""))
        return "\n".join(lines)


# --- reading a job's values -----------------------------------------------------------------


def _blocks(spec: dict[str, Any]) -> list[dict[str, Any]]:
    stages = spec.get("stages")
    return [b for b in stages if isinstance(b, dict)] if isinstance(stages, list) and stages else [spec]


def _hp(spec: dict[str, Any]) -> dict[str, Any]:
    block = _blocks(spec)[-1]
    hp = block.get("hyperparameters") if isinstance(block.get("hyperparameters"), dict) else None
    if hp is None and block is not spec and isinstance(spec.get("hyperparameters"), dict):
        hp = spec["hyperparameters"]
    return hp or {}


def job_value(rec: JobRecord, target: str) -> Any:
    """The job's value of a suggestion target (None when it cannot be read)."""
    stages = (rec.ran or {}).get("stages") or []
    if target in HP_DEFAULTS:
        return _hp(rec.spec).get(target, HP_DEFAULTS[target])
    if target == "base_model":
        return rec.spec.get("base_model")
    if target == "reward":
        fns = (((rec.spec.get("reward") or {}).get("functions") or []) if isinstance(rec.spec.get("reward"), dict)
               else [])
        return ",".join(sorted(str(f.get("name")) for f in fns if isinstance(f, dict))) or None
    if target == "algorithm":
        return [str(s.get("algorithm")).lower() for s in stages]
    if target == "data_source":
        return [str(s.get("data_source")) for s in stages]
    if target == "stage":
        return ">".join(str(s.get("algorithm")).lower() for s in stages) or None
    if target == "adapter":
        return str(stages[-1].get("peft") or "full") if stages else None
    return None


def adopted(s: Suggestion, before: JobRecord, after: JobRecord) -> bool:
    """Whether ``after`` (the next submitted job) carried out ``s`` (made after ``before``)."""
    a, b = job_value(after, s.target), job_value(before, s.target)
    value = s.value
    if a is None:
        return False
    if s.target in ("algorithm", "data_source"):
        return str(value).lower() in a
    if s.target in NUMERIC_TARGETS:
        try:
            a, b = float(a), float(b) if b is not None else None
        except (TypeError, ValueError):
            return False
        if value in ("increase", "decrease"):
            return b is not None and (a > b if value == "increase" else a < b)
        try:
            v = float(value)
        except (TypeError, ValueError):
            return False
        if math.isclose(a, v, rel_tol=0.05, abs_tol=1e-12):
            return True
        return b is not None and a != b and abs(a - v) < abs(b - v)
    return str(a).lower() == str(value).lower()


def parse_suggestions(items: Any) -> tuple[list[Suggestion], list[str]]:
    """Valid suggestions and the reasons others were dropped."""
    out, dropped = [], []
    for i, it in enumerate(items if isinstance(items, list) else []):
        if not isinstance(it, dict):
            dropped.append(f"suggestion {i} is not an object")
            continue
        target = str(it.get("target") or "").strip()
        want = suggestion_type(target)
        typ = str(it.get("type") or "").strip().lower()
        if want is None:
            dropped.append(f"suggestion {i}: unknown target {target!r}")
        elif typ != want:
            dropped.append(f"suggestion {i}: target {target} is a {want} suggestion, typed {typ!r}")
        elif it.get("value") in (None, ""):
            dropped.append(f"suggestion {i}: no value")
        else:
            out.append(Suggestion(typ, target, it["value"], str(it.get("text") or "")[:300]))
    return out, dropped


# --- the rule-based evaluator -----------------------------------------------------------------


class RuleEvaluator:
    """Deterministic heuristics from the measured facts of this stack (free, offline, reproducible)."""

    source = "rule"

    def __init__(self, min_gain: float):
        self.min_gain = min_gain

    def evaluate(self, history: Sequence[JobRecord], base_dev: float | None, task, **_: Any) -> Evaluation:
        last = history[-1]
        scored = [r.dev_score for r in history[:-1] if r.dev_score is not None]
        ref = scored[-1] if scored else base_dev
        ref_name = "the previous job" if scored else "the base model"
        gain = last.dev_score - ref if last.dev_score is not None and ref is not None else None
        ev = Evaluation(job=last.job, source=self.source)
        dev_txt = f"dev score {last.dev_score:.3f}" if last.dev_score is not None else "no dev score"
        ev.evaluation = f"job {last.job} {last.status}; {dev_txt}" + (
            f" ({gain:+.3f} vs {ref_name})" if gain is not None else "")
        ev.analysis = _curve_analysis(last.visible)
        if last.dev_score is not None:
            ev.prediction = round(min(1.0, max(0.0, last.dev_score + max(0.0, gain or 0.0) * 0.5)), 4)
        ev.suggestions = self._suggest(last, gain, task)
        return ev

    def _suggest(self, last: JobRecord, gain: float | None, task) -> list[Suggestion]:
        hp = _hp(last.spec)
        lr = float(hp.get("learning_rate", HP_DEFAULTS["learning_rate"]))
        stages = (last.ran or {}).get("stages") or []
        alg = str(stages[-1].get("algorithm")).lower() if stages else str(last.spec.get("algorithm") or "sft")
        adapter = "lora" if stages and str(stages[-1].get("peft")) != "full" else "full"
        out: list[Suggestion] = []
        if last.status == "diverged":
            out.append(Suggestion("execution", "learning_rate", _round(lr / 3), "the job diverged: lower the rate"))
        elif last.status == "timeout":
            steps = int(last.visible.get("steps") or hp.get("max_steps", 100))
            out.append(Suggestion("execution", "max_steps", max(10, int(steps * 0.7)), "it ran out of time"))
        elif last.status == "ok":
            lo, hi = GOOD_LR.get((alg, adapter), (1e-4, 3e-3))
            if lr < lo:
                out.append(Suggestion("execution", "learning_rate", lo, f"{lr:g} is below what works for {alg}"))
            elif lr > hi and (gain is None or gain < self.min_gain):
                out.append(Suggestion("execution", "learning_rate", hi, f"{lr:g} is above what works for {alg}"))
            budget = int(getattr(getattr(task, "budget", None), "max_steps", 0) or 0)
            steps = int(hp.get("max_steps", HP_DEFAULTS["max_steps"]))
            if budget and steps < budget // 2:
                out.append(Suggestion("execution", "max_steps", budget, "use the step budget"))
            if gain is not None and gain < self.min_gain and alg in ALTERNATIVE:
                out.append(Suggestion("strategy", "algorithm", ALTERNATIVE[alg],
                                      f"the dev score did not rise ({gain:+.3f}); try {ALTERNATIVE[alg]}"))
        return out[:3]


def _round(x: float) -> float:
    return float(f"{x:.1e}")


def _curve_analysis(v: dict[str, Any]) -> str:
    parts = []
    for key, name in (("loss_curve", "training loss"), ("reward_curve", "training reward")):
        c = v.get(key) or []
        if len(c) >= 2:
            parts.append(f"{name} {c[0][1]:.3f} -> {c[-1][1]:.3f}")
    if v.get("error"):
        parts.append("error: " + str(v["error"]).strip().splitlines()[-1][:160])
    return "; ".join(parts) or "no training curve"


# --- the LLM evaluator ------------------------------------------------------------------------

EVALUATE_SCHEMA = tool_schema(
    "evaluate", "Evaluate the job that just ran and suggest what the next job should change.",
    {"prediction": {"type": "number", "description": "the dev score you expect the next job to reach"},
     "evaluation": {"type": "string", "description": "how good the job was, in one sentence"},
     "analysis": {"type": "string", "description": "why: what in the curves, settings or strategy explains it"},
     "suggestions": {"type": "array", "description": "[{type: execution|strategy, target, value, text}]; execution "
                     "targets: " + ", ".join(EXECUTION_TARGETS)
                     + "; strategy targets: " + ", ".join(STRATEGY_TARGETS)}},
    ["evaluation", "suggestions"])

EVALUATOR_PROMPT = ("You evaluate training jobs another agent ran. After each job: predict the next job's dev score, "
                    "evaluate the job, analyse why, and suggest changes (type execution: hyperparameters, base model, "
                    "reward; type strategy: algorithm, data_source, stage, adapter). Answer with one evaluate call.")


class LLMEvaluator:
    """A second agent (any ``AgentBackend``) answering one ``evaluate`` tool call per job."""

    source = "llm"

    def __init__(self, backend, *, model_name: str = "evaluator", temperature: float = EvaluatorConfig.temperature,
                 max_new_tokens: int = EvaluatorConfig.max_new_tokens, ledger=None):
        self.backend, self.model_name = backend, model_name
        self.temperature, self.max_new_tokens, self.ledger = temperature, max_new_tokens, ledger

    def context(self, history: Sequence[JobRecord], base_dev: float | None, task) -> str:
        import yaml

        last = history[-1]
        lines = [f"Task: {task.family} ({task.name}); budget per job {task.budget.max_steps} steps.",
                 f"Base model dev score: {base_dev:.3f}" if base_dev is not None else "Base model dev score: unknown"]
        for r in history:
            lines.append(f"job {r.job}: {r.status}, strategy {r.label or '-'}, dev score "
                         + (f"{r.dev_score:.3f}" if r.dev_score is not None else "-"))
        lines.append("Last job.yaml:\n" + yaml.safe_dump(last.spec, sort_keys=False, width=120).strip())
        lines.append("Its result: " + _curve_analysis(last.visible))
        return "\n".join(lines)

    def evaluate(self, history: Sequence[JobRecord], base_dev: float | None, task, *, episode: str = "0",
                 seed: int | None = None) -> Evaluation:
        from agent_trainer.outer_loop.agents.base import BackendError

        ev = Evaluation(job=history[-1].job, source=self.source)
        messages = [{"role": "system", "content": EVALUATOR_PROMPT},
                    {"role": "user", "content": self.context(history, base_dev, task)}]
        try:
            gen = self.backend.generate(messages, [EVALUATE_SCHEMA], temperature=self.temperature,
                                        max_new_tokens=self.max_new_tokens, seed=seed)
        except BackendError as e:
            ev.malformed = f"backend error: {e}"
            return ev
        ev.tokens_in, ev.tokens_out = gen.prompt_tokens, gen.completion_tokens
        if self.ledger is not None:
            self.ledger.record_llm(episode=episode, model=self.model_name, tokens_in=gen.prompt_tokens,
                                   tokens_out=gen.completion_tokens, role="evaluator")
        call = next((c for c in gen.tool_calls if c["name"] == "evaluate"), None)
        if call is None:
            ev.malformed = "no evaluate call in the answer: " + (gen.text or "")[:120].replace("\n", " ")
            return ev
        args, problem = check_arguments(EVALUATE_SCHEMA, call["arguments"])
        if args is None:
            ev.malformed = problem
            return ev
        ev.evaluation = str(args.get("evaluation", ""))[:500]
        ev.analysis = str(args.get("analysis", ""))[:800]
        pred = args.get("prediction")
        ev.prediction = float(pred) if isinstance(pred, (int, float)) and not isinstance(pred, bool) else None
        ev.suggestions, ev.dropped = parse_suggestions(args.get("suggestions"))
        return ev
