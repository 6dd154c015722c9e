"""The CONTINUE/SWITCH protocol (``strategy=check``): the ``decide`` tool, its validation, the switch rule.

    >>> hint = switch_hint(dev_scores, base_dev, window=2, min_gain=0.01)   # "" when the rule does not fire
    >>> decision, problem = parse_decision(arguments, shown_scores, current_of(ran))   # (None, why) if malformed

The tool's fields and the rule: docs/strategy.md, "CONTINUE/SWITCH". The rule is a hint in the
message, never an override of the agent's answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from agent_trainer.outer_loop.episode.tools import check_arguments, tool_schema

DECISIONS = ("CONTINUE", "SWITCH")
ALGORITHMS = ("sft", "grpo", "dpo", "distill")
DATA_SOURCES = ("curated", "self_generated", "agent", "mixed")
COMPONENTS = ("algorithm", "data_source", "stage")
SCORE_TOLERANCE = 0.011  # scores are shown with 3 decimals; an agent may round to 2
MIN_REASON_WORDS = 3

DECIDE_SCHEMA = tool_schema(
    "decide", "Answer the strategy check after a job result: CONTINUE or SWITCH.",
    {"strategy": {"type": "string", "description": "your current strategy: algorithm, data source, stages"},
     "scores": {"type": "array", "description": "your last three dev scores, oldest first (as the check shows them)"},
     "decision": {"type": "string", "description": "CONTINUE or SWITCH"},
     "component": {"type": "string", "description": "SWITCH: algorithm | data_source | stage"},
     "alternative": {"type": "string",
                     "description": "SWITCH: the concrete new value, e.g. grpo, self_generated, sft>grpo"},
     "reason": {"type": "string",
                "description": "SWITCH: why the alternative; CONTINUE: why scores should still rise"}},
    ["strategy", "scores", "decision", "reason"])


@dataclass
class Current:
    """The strategy of the last executed job, in the protocol's terms."""

    algorithm: str | None = None     # the final stage's algorithm
    data_source: str | None = None
    stage: str | None = None         # "sft" for one stage, "sft>grpo" for two

    def value(self, component: str) -> str | None:
        return getattr(self, component)


@dataclass
class Decision:
    """A valid answer to the check."""

    decision: str
    strategy: str
    scores: list[float]
    reason: str
    component: str | None = None
    alternative: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def current_of(ran: dict[str, Any] | None) -> Current:
    """``Current`` from a job's ``ran`` record (stages that trained)."""
    stages = [s for s in (ran or {}).get("stages", []) if int(s.get("steps") or 0) > 0]
    if not stages:
        return Current()
    sources = {str(s.get("data_source") or "curated") for s in stages}
    return Current(algorithm=str(stages[-1].get("algorithm")).lower(),
                   data_source=sources.pop() if len(sources) == 1 else "mixed",
                   stage=">".join(str(s.get("algorithm")).lower() for s in stages))


def _valid_value(component: str, value: str) -> bool:
    if component == "algorithm":
        return value in ALGORITHMS
    if component == "data_source":
        return value in DATA_SOURCES
    parts = value.split(">")
    return 1 <= len(parts) <= 4 and all(p in ALGORITHMS for p in parts)


def parse_decision(arguments: Any, shown_scores: Sequence[float], current: Current) -> tuple[Decision | None, str]:
    """``(Decision, "")`` for a valid answer, ``(None, what is wrong)`` otherwise."""
    args, problem = check_arguments(DECIDE_SCHEMA, arguments)
    if args is None:
        return None, problem
    decision = str(args["decision"]).strip().upper()
    if decision not in DECISIONS:
        return None, f"decision must be CONTINUE or SWITCH, got {args['decision']!r}"
    scores = args["scores"]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores):
        return None, "scores must be numbers, e.g. [0.21, 0.24]"
    want = list(shown_scores)[-3:]
    if len(scores) != len(want):
        return None, f"scores must be your last {len(want)} dev score(s) {_fmt(want)}, got {len(scores)} value(s)"
    wrong = [i for i, (a, b) in enumerate(zip(scores, want)) if abs(float(a) - float(b)) > SCORE_TOLERANCE]
    if wrong:
        return None, f"scores {_fmt(scores)} do not match your dev scores {_fmt(want)}; copy them from the check"
    reason = str(args["reason"]).strip()
    if len(reason.split()) < MIN_REASON_WORDS:
        why = "why the alternative should do better" if decision == "SWITCH" else "why scores should still rise"
        return None, f"reason is too short; say {why} in a sentence"
    if not str(args["strategy"]).strip():
        return None, "strategy is empty; name your current algorithm, data source and stages"
    out = Decision(decision=decision, strategy=str(args["strategy"]).strip(), scores=[float(x) for x in scores],
                   reason=reason)
    if decision == "SWITCH":
        component = str(args.get("component") or "").strip().lower()
        alternative = str(args.get("alternative") or "").strip().lower()
        if component not in COMPONENTS:
            return None, f"SWITCH needs component: one of {', '.join(COMPONENTS)}"
        if not alternative or not _valid_value(component, alternative):
            return None, f"SWITCH needs a concrete alternative for {component}: {_choices(component)}"
        if alternative == current.value(component):
            return None, f"alternative {alternative!r} is your current {component}; name a different one"
        out.component, out.alternative = component, alternative
    return out, ""


def _choices(component: str) -> str:
    if component == "algorithm":
        return " | ".join(ALGORITHMS)
    if component == "data_source":
        return " | ".join(DATA_SOURCES)
    return "algorithms joined by '>', e.g. sft>grpo"


def _fmt(xs: Sequence[float]) -> str:
    return "[" + ", ".join(f"{float(x):.3f}" for x in xs) + "]"


def switch_hint(scores: Sequence[float | None], base: float | None, window: int, min_gain: float) -> str:
    """The rule's hint, or "" when it does not fire.

    ``scores``: dev scores of the executed jobs so far (None where a job could not be scored), ``base``:
    the base model's. Fires when each of the last ``window`` gains is below ``min_gain``."""
    series = ([base] if base is not None else []) + [s for s in scores if s is not None]
    if len(series) < window + 1:
        return ""
    gains = [b - a for a, b in zip(series[-window - 1:], series[-window:])]
    if all(g < min_gain for g in gains):
        return (f"Rule: your dev score rose by less than {min_gain:g} in each of the last {window} steps "
                f"({', '.join(f'{g:+.3f}' for g in gains)}): consider SWITCH.")
    return ""


def check_message(job: int, label: str, shown: Sequence[tuple[int, float]], base: float | None, hint: str,
                  dev_size: int, jobs_left: int) -> str:
    """The message that asks for a decision after job ``job``'s result; ``shown``: the last three (job, dev score)."""
    listed = ", ".join(f"job {i}: {s:.3f}" for i, s in shown) or "none (no job could be scored)"
    base_txt = f"; base model {base:.3f}" if base is not None else ""
    return (f"Check after job {job} ({jobs_left} job(s) left). Your strategy: {label}. "
            f"Dev scores ({dev_size} public dev items{base_txt}): {listed}. {hint + ' ' if hint else ''}"
            "Answer now with decide(strategy, scores, decision, component, alternative, reason): scores = your "
            "last three dev scores; decision CONTINUE (reason: why scores should still rise) or SWITCH "
            "(component: algorithm | data_source | stage; alternative: e.g. grpo, self_generated, sft>grpo; "
            "reason: why).")
