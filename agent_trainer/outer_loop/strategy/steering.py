"""Steering an episode between its jobs: the CONTINUE/SWITCH check, interventions, journal, skills, evaluator.

One ``Steering`` per episode; the episode calls its hooks ``attach`` (registers the enabled tools),
``after_job`` (records the job, returns the messages to add) and ``handle_turn`` (reads the answer to a check).

    >>> steer = make_steering(cfg.strategy, run_dir=folder, ledger=ledger, cache_dir=cfg.cache_dir, device="cpu")
    >>> ep = Episode(backend, task, folder / "episodes" / "0", steering=steer, ...)

Events go into the episode's ``trajectory.jsonl``, ``summary()`` / ``metrics()`` into ``summary.json`` and
MLflow. The protocol, the dev score and the settings: docs/strategy.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent_trainer.config import EvaluatorConfig, EvaluatorKind, StrategyConfig, StrategyMode
from agent_trainer.evaluation.prompts import for_task
from agent_trainer.outer_loop.strategy import protocol, strategy
from agent_trainer.outer_loop.strategy.evaluator import Evaluation, JobRecord, adopted
from agent_trainer.outer_loop.episode.tools import ToolResult

DEV_SEED = 999_999  # the last agent seed (agent_trainer.evaluation.families.MAX_AGENT_SEED - 1): public, disjoint
                    # from hidden
_DEV_CACHE: dict[tuple[str, str, int], float] = {}


def wanted(s: StrategyConfig) -> bool:
    """Whether the ``strategy`` group asks for any steering (else episodes run exactly as without it)."""
    return s.mode != StrategyMode.none or s.evaluator.kind != EvaluatorKind.none \
        or any((s.interventions, s.journal, s.skills))


def make_evaluator(e: EvaluatorConfig, *, min_gain: float, device: str, ledger=None, cache_dir=None):
    """The evaluator of the ``strategy.evaluator`` group (None for kind none); ``min_gain``: ``strategy.rule_min_gain``,
    the dev-score gain below which the rule evaluator sees no progress; ``device``: where a local LLM evaluator runs
    (the agent's, ``hardware.agent_device`` resolved)."""
    from agent_trainer.outer_loop.strategy.evaluator import LLMEvaluator, RuleEvaluator

    if e.kind == EvaluatorKind.none:
        return None
    if e.kind == EvaluatorKind.rule:
        return RuleEvaluator(min_gain=min_gain)
    from agent_trainer.outer_loop.agents import make_backend

    if e.backend == "local" and not e.model_path:
        from agent_trainer.inner_loop.models import resolve_model
        from agent_trainer.outer_loop.agents.agent_model import register

        register()
        backend = make_backend({"kind": "local", "model_path": str(resolve_model(e.model, cache_dir=cache_dir)),
                                "model_name": e.model, "device": device})
    else:
        backend = make_backend({"kind": e.backend, "model": e.model, "base_url": e.base_url,
                                "api_key_env": e.api_key_env, **({"model_path": e.model_path} if e.model_path else {})})
    if ledger is not None:
        ledger.prices.llm.setdefault(e.model, (e.usd_per_1m_tokens_in, e.usd_per_1m_tokens_out))
    return LLMEvaluator(backend, model_name=e.model, temperature=e.temperature, max_new_tokens=e.max_new_tokens,
                        ledger=ledger)


def make_steering(s: StrategyConfig, *, device: str, run_dir=None, ledger=None, cache_dir=None
                  ) -> "Steering | None":
    """A fresh ``Steering`` for one episode from the ``strategy`` group, or None when nothing is on."""
    if not wanted(s):
        return None
    evaluator = make_evaluator(s.evaluator, min_gain=s.rule_min_gain, device=device, ledger=ledger,
                               cache_dir=cache_dir)
    return Steering(s, evaluator=evaluator, run_dir=run_dir, cache_dir=cache_dir)


# --- dev scores -------------------------------------------------------------------------------


def dev_score(model_dir: str | Path, family: str, n: int, fmt=None) -> float | None:
    """Mean score of a saved model on ``n`` public dev items of ``family`` (prompts in the task's format
    ``fmt``, ``agent_trainer.evaluation.prompts``; None: raw); None when it cannot be scored."""
    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import EvalError, load_checkpoint, score_examples
    from agent_trainer.evaluation.prompts import RAW
    from agent_trainer.inner_loop.run.job import HARNESS_LOCK

    model_dir = Path(model_dir)
    if n <= 0 or not (model_dir / "config.json").is_file():
        return None
    fam = get_family(family)
    try:
        with HARNESS_LOCK:
            model, tok = load_checkpoint(model_dir)
            score, _ = score_examples(model, tok, fam, fam.training_examples(DEV_SEED, n), fmt=fmt or RAW)
    except (EvalError, OSError, ValueError, RuntimeError):
        return None
    return round(float(score), 4)


def base_dev_score(base_model: str, family: str, n: int, cache_dir=None, fmt=None) -> float | None:
    """The base model's dev score (cached per process)."""
    from agent_trainer.inner_loop.models import resolve_model

    try:
        path = Path(resolve_model(base_model, cache_dir=cache_dir))
    except Exception:  # an unknown base model: the job was refused anyway
        return None
    key = (str(path), family, n, getattr(fmt, "key", "raw"))
    if key not in _DEV_CACHE:
        value = dev_score(path, family, n, fmt)
        if value is None:
            return None
        _DEV_CACHE[key] = value
    return _DEV_CACHE[key]


def _followed(d: dict[str, Any], now: protocol.Current) -> bool:
    """Whether the job after a SWITCH decision has the named alternative (an algorithm: in any stage)."""
    if d["component"] == "algorithm":
        return d["alternative"] in (now.stage or "").split(">")
    return now.value(d["component"]) == d["alternative"]


# --- the per-episode controller ---------------------------------------------------------------


@dataclass
class _Open:
    """A check waiting for the agent's decide answer."""

    job: int
    shown: list[tuple[int, float]]
    current: protocol.Current
    hint: str
    attempts: int = 0
    problems: list[str] = field(default_factory=list)


class Steering:
    """The strategy layer of one episode (see the module docstring); ``settings``: the ``strategy`` group
    (``agent_trainer.config.StrategyConfig``)."""

    def __init__(self, settings: StrategyConfig, *, evaluator=None, run_dir=None, cache_dir=None):
        self.settings, self.evaluator = settings, evaluator
        self.run_dir = Path(run_dir) if run_dir else None
        self.cache_dir = cache_dir
        self.records: list[JobRecord] = []
        self.decisions: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self.adoptions: list[dict[str, Any]] = []
        self.interventions: list[dict[str, Any]] = []
        self.base_dev: float | None = None
        self.journal = None
        self._open: _Open | None = None
        self._pending_suggestions: tuple[JobRecord, Evaluation] | None = None
        self._ep = None

    # --- set-up ---------------------------------------------------------------------------
    @property
    def needs_dev(self) -> bool:
        return self.settings.dev_size > 0 and (self.settings.mode == "check" or self.evaluator is not None)

    def attach(self, ep) -> None:
        """Register the enabled tools on the episode's ToolBox."""
        from agent_trainer.outer_loop.strategy.journal import Journal, SkillLibrary, journal_tools, skill_tools

        self._ep = ep
        if self.settings.mode == "check":
            ep.box.register(protocol.DECIDE_SCHEMA, self._decide_out_of_turn)
        if self.settings.journal:
            path = Path(self.settings.journal_path) if self.settings.journal_path else ep.dir / "journal.jsonl"
            if not path.is_absolute():
                path = (self.run_dir or ep.dir) / path
            self.journal = Journal(path, episode=ep.id)
            for schema, impl in journal_tools(self.journal, lambda: len(ep.box.state.jobs)):
                ep.box.register(schema, impl)
        if self.settings.skills:
            for schema, impl in skill_tools(SkillLibrary(self.settings.skills_dir)):
                ep.box.register(schema, impl)

    def system_note(self) -> str:
        """Sentences added to the system prompt for the enabled features ("" when none)."""
        notes = []
        if self.settings.mode == "check":
            notes.append("After each job result answer the check with decide (CONTINUE or SWITCH).")
        if self.settings.journal:
            notes.append("Keep an experiment journal: journal_write a plan (hypothesis, success and abort "
                         "criteria) before each job and a lesson after it; journal_read shows past entries.")
        if self.settings.skills:
            notes.append("list_skills and read_skill give short notes on what works.")
        return " ".join(notes)

    def _decide_out_of_turn(self, **_: Any) -> ToolResult:
        return ToolResult("no check is open: decide answers the check that follows a job result", ok=False)

    # --- after a job -----------------------------------------------------------------------
    def after_job(self, ep, result, *, live: bool = True) -> list[dict[str, Any]]:
        """Record job ``len(jobs)``; while jobs are left and ``live``, the messages for the agent."""
        k = len(ep.box.state.jobs)
        job_dir = Path(getattr(result, "job_dir", "") or ep.box.jobs_dir / f"{k - 1:02d}" / "job")
        try:
            spec = yaml.safe_load((job_dir / "job.yaml").read_text())
        except (OSError, yaml.YAMLError):
            spec = None
        ran = strategy.ran_of(result, job_dir)
        lab = strategy.label(ran) if result.status not in strategy.NOT_RUN else None
        rec = JobRecord(job=k, status=result.status, spec=spec if isinstance(spec, dict) else {}, ran=ran, label=lab,
                        visible=result.visible(), hidden_score=getattr(result, "hidden_score", None))
        if self.needs_dev and result.status in ("ok", "timeout"):
            # A job-cache hit has no weights of its own: they stay where the original run wrote them.
            model = Path(result.output_dir) / "model"
            if not model.is_dir() and getattr(result, "cached_from", None):
                model = Path(result.cached_from) / "model"
            fmt = for_task(ep.task)
            rec.dev_score = dev_score(model, ep.task.family, self.settings.dev_size, fmt)
            if self.base_dev is None and getattr(result, "base_model", None):
                self.base_dev = base_dev_score(result.base_model, ep.task.family, self.settings.dev_size,
                                               self.cache_dir, fmt)
        self._resolve(ep, rec)
        self.records.append(rec)
        ep.log({"event": "strategy_job", **rec.brief(), "ran": ran, "base_dev": self.base_dev})
        jobs_left = ep.box.limits.max_jobs_per_episode - ep.box.state.submitted
        if not live or jobs_left <= 0 or ep.box.state.finished:
            return []
        msgs = []
        if self.evaluator is not None:
            msgs += self._evaluate(ep, rec)
        for iv in self.settings.interventions:
            if iv.after_job == k:
                self.interventions.append({"after_job": k, "message": iv.message})
                ep.log({"event": "intervention", "after_job": k, "message": iv.message})
                msgs.append({"role": "user", "content": iv.message})
        if self.settings.mode == "check":
            msgs.append({"role": "user", "content": self._open_check(ep, rec, jobs_left)})
        return msgs

    def _resolve(self, ep, rec: JobRecord) -> None:
        """Outcomes of the last decision and adoption of the last suggestions, now that ``rec`` ran."""
        if self._pending_suggestions is not None:
            before, ev = self._pending_suggestions
            for sug in ev.suggestions:
                row = {"after_job": before.job, "next_job": rec.job, "type": sug.type, "target": sug.target,
                       "value": sug.value, "adopted": adopted(sug, before, rec)}
                self.adoptions.append(row)
                ep.log({"event": "adoption", **row})
            if ev.prediction is not None and rec.dev_score is not None:
                self.evaluations[-1]["prediction_error"] = abs(ev.prediction - rec.dev_score)
            self._pending_suggestions = None
        if rec.label is None:
            return  # an outcome needs an executed job
        for d in self.decisions:
            if d.get("outcome") is not None:
                continue
            prev = next((r for r in reversed(self.records) if r.job <= d["after_job"] and r.label is not None), None)
            comps = list(strategy.diff(prev.label, rec.label)) if prev is not None else []
            followed = (not comps if d["decision"] == "CONTINUE" else
                        _followed(d, protocol.current_of(rec.ran)) if d["decision"] == "SWITCH" else None)
            ref = prev.dev_score if prev is not None else None
            out = {"next_job": rec.job, "switched": bool(comps), "components": comps, "followed": followed,
                   "dev_rose": None if rec.dev_score is None or ref is None else rec.dev_score > ref,
                   "hidden_rose": None if rec.hidden_score is None or prev is None or prev.hidden_score is None
                   else rec.hidden_score > prev.hidden_score}
            d["outcome"] = out
            ep.log({"event": "decision_outcome", "after_job": d["after_job"], "decision": d["decision"], **out})

    def _evaluate(self, ep, rec: JobRecord) -> list[dict[str, Any]]:
        ev = self.evaluator.evaluate(self.records, self.base_dev, ep.task, episode=ep.id,
                                     seed=ep.seed * 1000 + 500 + rec.job)
        row = ev.as_dict()
        self.evaluations.append(row)
        ep.log({"event": "evaluation", **row})
        if ev.suggestions:
            self._pending_suggestions = (rec, ev)
        if self.journal is not None and not ev.malformed:
            self.journal.write("eval_result", ev.evaluation or "-", author=f"evaluator:{ev.source}", job=rec.job)
            if ev.analysis:
                self.journal.write("eval_analysis", ev.analysis, author=f"evaluator:{ev.source}", job=rec.job)
        return [{"role": "user", "content": ev.text()}] if self.settings.evaluator.show_to_agent else []

    # --- the check -------------------------------------------------------------------------
    def dev_series(self) -> list[tuple[int, float]]:
        """(job, dev score) of the executed jobs that could be scored."""
        return [(r.job, r.dev_score) for r in self.records if r.label is not None and r.dev_score is not None]

    def _open_check(self, ep, rec: JobRecord, jobs_left: int) -> str:
        series = self.dev_series()
        last_exec = next((r for r in reversed(self.records) if r.label is not None), None)
        hint = protocol.switch_hint([s for _, s in series], self.base_dev, self.settings.rule_window,
                                    self.settings.rule_min_gain)
        self._open = _Open(job=rec.job, shown=series[-3:], current=protocol.current_of(last_exec.ran if last_exec
                                                                                          else None), hint=hint)
        label = str(last_exec.label) if last_exec else "no job has trained yet"
        text = protocol.check_message(rec.job, label, series[-3:], self.base_dev, hint, self.settings.dev_size,
                                      jobs_left)
        ep.log({"event": "check", "after_job": rec.job, "hint": bool(hint), "shown": series[-3:]})
        return text

    def handle_turn(self, ep, gen) -> bool:
        """Take the agent's turn as its answer to an open check; False when no check is open."""
        if self._open is None:
            return False
        o = self._open
        calls = list(gen.tool_calls or [])
        call = next((c for c in calls if c["name"] == "decide"), None)
        if call is not None:
            decision, problem = protocol.parse_decision(call["arguments"], [s for _, s in o.shown], o.current)
        else:
            decision = None
            problem = ("no tool call" if not calls else
                       f"called {', '.join(c['name'] for c in calls)} instead of decide")
        for c in calls:
            if c is call:
                text = f"decision recorded: {decision.decision}" if decision else f"malformed: {problem}"
            else:
                text = "not run: answer the check with decide(...) first"
            ep._add_message({"role": "tool", "tool_call_id": c["id"], "name": c["name"], "content": text},
                            ok=c is call and decision is not None)
        o.attempts += 1
        if decision is None:
            o.problems.append(problem)
            ep.log({"event": "decision_attempt", "after_job": o.job, "attempt": o.attempts, "problem": problem})
            if o.attempts <= self.settings.max_reasks:
                ep._add_message({"role": "user", "content": f"Your answer to the check is malformed: {problem}. "
                                 "Answer again with one decide call."})
                return True
        row = {"after_job": o.job, "attempts": o.attempts, "hint": bool(o.hint), "problems": o.problems,
               "decision": decision.decision if decision else "MALFORMED", "outcome": None,
               **({k: v for k, v in decision.as_dict().items() if k != "decision"} if decision else
                  {"component": None, "alternative": None, "reason": None, "strategy": None, "scores": None})}
        self.decisions.append(row)
        ep.log({"event": "decision", **row})
        self._open = None
        if decision is None:
            ep._add_message({"role": "user",
                             "content": "Your answer was logged as malformed. Go on with your next job."})
        return True

    # --- results ---------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Everything the layer recorded, plus its metrics."""
        return {"jobs": [r.brief() for r in self.records], "base_dev": self.base_dev, "decisions": self.decisions,
                "evaluations": self.evaluations, "adoptions": self.adoptions, "interventions": self.interventions,
                "metrics": self.metrics()}

    def metrics(self) -> dict[str, float]:
        """Decision, adoption and evaluator metrics (only those that have a value)."""
        m: dict[str, float] = {}
        d = self.decisions
        if self.settings.mode == "check":
            m["decisions"] = len(d)
            for kind in ("CONTINUE", "SWITCH", "MALFORMED"):
                m[f"decisions_{kind.lower()}"] = sum(x["decision"] == kind for x in d)
            m["decisions_hinted"] = sum(x["hint"] for x in d)
            m["decisions_reasked"] = sum(x["attempts"] > 1 for x in d)
            for kind, key in (("SWITCH", "switch_followed_rate"), ("CONTINUE", "continue_kept_rate")):
                done = [x for x in d if x["decision"] == kind and x["outcome"] is not None]
                if done:
                    m[key] = sum(bool(x["outcome"]["followed"]) for x in done) / len(done)
                rose = [x for x in done if x["outcome"]["dev_rose"] is not None]
                if rose:
                    m[f"dev_rose_after_{kind.lower()}"] = sum(x["outcome"]["dev_rose"] for x in rose) / len(rose)
        if self.evaluator is not None:
            m["evaluations"] = len(self.evaluations)
            m["evaluations_malformed"] = sum(bool(e["malformed"]) for e in self.evaluations)
            for t in ("execution", "strategy"):
                rows = [a for a in self.adoptions if a["type"] == t]
                m[f"suggestions_{t}"] = len(rows)
                m[f"adopted_{t}"] = sum(a["adopted"] for a in rows)
                if rows:
                    m[f"adoption_{t}"] = m[f"adopted_{t}"] / len(rows)
            errs = [e["prediction_error"] for e in self.evaluations if e.get("prediction_error") is not None]
            if errs:
                m["evaluator_prediction_mae"] = sum(errs) / len(errs)
        if self.settings.interventions:
            m["interventions"] = len(self.interventions)
        return {k: float(v) for k, v in m.items()}
