"""One episode: an agent, a fresh workspace and the tools, from the task to a staged reward.

    >>> ep = Episode(backend, task, run_dir / "episodes" / "0", ledger=ledger, settings=EpisodeSettings())
    >>> ep.play()              # agent turns until it finishes, runs out of turns or submits max_jobs
    >>> ep.run_pending()       # deferred jobs (at-train runs a whole batch of them in parallel instead)
    >>> result = ep.finish()   # staged reward, trajectory and summary written to the episode folder

The episode folder and the staged reward: docs/outer_loop.md, "An episode"; several jobs per episode,
deferred jobs (``play_all``) and ``steering``: docs/strategy.md.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent_trainer.config import AgentConfig, BudgetConfig, Config, RewardConfig, StrategyConfig
from agent_trainer.outer_loop.agents.base import BackendError, SampleRequest
from agent_trainer.evaluation.staged_reward import staged_reward
from agent_trainer.inner_loop.run.request import JobRequest, JobSettings
from agent_trainer.outer_loop.episode.tools import PendingJob, ToolBox, ToolLimits
from agent_trainer.outer_loop.episode.workspace import Workspace

# Terse on purpose: the tiny agent's tokenizer spends ~2 characters per token, and every turn re-reads this.
SYSTEM_PROMPT = (
    "You are an ML engineer agent. Post-train a small model for the task: write job.yaml, check it with "
    "validate_job, fix what it reports, then submit_job. Reward: the trained model's hidden score minus its "
    "base model's. Answer with one tool call."
)
# A turn's sampling seed is the episode's seed times this plus the turn number: a scripted agent
# (agent_trainer.outer_loop.agents.scripted) reads the episode's seed back from it.
TURN_SEED_STRIDE = 1000
NO_TOOL_CALL = "No tool call was found in your answer. Answer with one tool call, e.g. validate_job or submit_job."


@dataclass
class EpisodeSettings:
    """What an episode reads: the schema's groups themselves (``agent_trainer.config``), as they come from the
    config. ``agent``: its turns, sampling, ``tool_schemas``, ``validate_dry_run`` and ``submit_at_turn_limit``;
    ``budget``: ``max_jobs_per_episode``; ``strategy``: ``episode_reward`` (which job's outcome the reward uses);
    ``reward``: the outer group's reward weights."""

    agent: AgentConfig = field(default_factory=AgentConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)

    @classmethod
    def from_config(cls, c: Config) -> "EpisodeSettings":
        """The settings of a validated config (``agent_trainer.config.validate``): its groups, not copies."""
        return cls(agent=c.agent, budget=c.budget, strategy=c.strategy, reward=c.outer.reward)


def tool_schemas_for(schemas: list[dict[str, Any]], style: str) -> list[dict[str, Any]] | None:
    """Schemas as the backend should get them for a ``tool_schemas`` style."""
    if style == "full":
        return schemas
    if style == "compact":
        return compact_tool_schemas(schemas)
    if style == "names":
        return None
    raise ValueError(f"tool_schemas must be full, compact or names, got {style!r}")


def tool_signatures(schemas: list[dict[str, Any]]) -> str:
    """One line naming every tool with its arguments, e.g. ``write_file(path, content)``."""
    return ", ".join(f"{s['function']['name']}({', '.join(s['function']['parameters']['properties'])})"
                     for s in schemas)


def opening_messages(task, tool_style: str = "full", schemas: list[dict[str, Any]] | None = None,
                     note: str = "") -> list[dict[str, Any]]:
    """The system and user messages every episode starts with (``schemas``: the episode's tools, default
    the standard set; ``note``: sentences the strategy layer adds for the tools it enabled)."""
    from agent_trainer.outer_loop.episode.tools import SCHEMAS

    system = SYSTEM_PROMPT + (" " + note if note else "")
    if tool_style == "names":
        system += " Tools: " + tool_signatures(schemas or SCHEMAS) + "."
    return [{"role": "system", "content": system}, {"role": "user", "content": task_message(task)}]


def task_message(task) -> str:
    """The user message that opens an episode: the instruction and the task's public facts.

    The facts are written as job.yaml writes them (``family: calc_chain``, ``base_model: tiny-s``): a tiny
    agent copies them into its job far more reliably when the surrounding tokens match."""
    budget = task.budget
    return (
        f"{task.instruction}\nfamily: {task.family}\nbase_model: {' or '.join(task.allowed_base_models)}\n"
        f"budget per job: max_steps {budget.max_steps}, {budget.max_seconds:g} s, ${budget.max_usd:g}\n"
        f"Workspace: task.json, GUIDE.md (job.yaml schema, reward library)."
    )


@dataclass
class TurnRecord:
    """One sampled agent turn, as the policy update needs it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    temperature: float


@dataclass
class EpisodeResult:
    """What an episode produced; the harness's view (holds hidden scores)."""

    episode_id: str
    task: str
    family: str
    status: str                      # finished | max_turns | max_jobs | budget_exhausted | backend_error
    reward: dict[str, Any]
    turns: list[TurnRecord]
    n_turns: int
    jobs: list[dict[str, Any]]
    choices: dict[str, Any]
    tokens_in: int
    tokens_out: int
    usd: float
    seconds: float
    strategy: dict[str, Any] = field(default_factory=dict)   # labels, switches, steering
                                                             # (agent_trainer.outer_loop.strategy.strategy)
    submitted_unfixed: int = 0   # jobs submitted unchanged after validate_job called them INVALID
    harness_submitted: int = 0   # jobs the harness submitted at the turn limit (agent.submit_at_turn_limit)
    refused_calls: int = 0       # tool calls refused before a tool ran (bad arguments, a path it may not use)

    def summary(self) -> dict[str, Any]:
        """Everything but the token-level turns (for summary.json and MLflow)."""
        d = asdict(self)
        d.pop("turns")
        return d


class Episode:
    """An agent working on one task in its own folder."""

    def __init__(self, backend, task, episode_dir: str | Path, *, ledger=None, settings: EpisodeSettings | None = None,
                 episode_id: str | None = None, seed: int = 0, defer_jobs: bool = False,
                 job_settings: JobSettings | None = None, model_name: str = "agent", steering=None):
        """``steering``: an ``agent_trainer.outer_loop.strategy.steering.Steering`` (check protocol, interventions,
        journal, evaluator)."""
        self.backend, self.task = backend, task
        self.dir = Path(episode_dir)
        self.settings = settings or EpisodeSettings()
        self.id = episode_id or self.dir.name
        self.ledger, self.seed, self.model_name = ledger, seed, model_name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ws = Workspace.create(self.dir / "workspace", task)
        agent = self.settings.agent
        limits = ToolLimits(max_turns=agent.max_turns, max_jobs_per_episode=self.settings.budget.max_jobs_per_episode)
        self.box = ToolBox(self.ws, task, limits=limits, jobs_dir=self.dir / "jobs", ledger=ledger, episode=self.id,
                           defer_jobs=defer_jobs, job_settings=job_settings,
                           validate_kwargs={"dry_run": agent.validate_dry_run})
        self.steering = steering
        if steering is not None:
            steering.attach(self)
        self.messages: list[dict[str, Any]] = opening_messages(
            task, agent.tool_schemas, self.box.schemas(), steering.system_note() if steering else "")
        self.turns: list[TurnRecord] = []
        self.status = "running"
        self.tokens_in = self.tokens_out = 0
        self._pending_calls: dict[int, str] = {}  # pending job index -> tool_call_id of its submit_job
        self._last_prompt = 0                      # prompt tokens of the last turn (the ledger's estimate)
        self._t0 = time.time()
        self._traj = open(self.dir / "trajectory.jsonl", "a", encoding="utf-8")
        for m in self.messages:
            self.log({"event": "message", **m})

    # --- the agent's turns --------------------------------------------------------------------
    def play(self) -> str:
        """Run agent turns until the episode ends; returns the status."""
        while (request := self.next_request()) is not None:
            try:
                gen = self.backend.generate(request.messages, request.tools, temperature=request.temperature,
                                            max_new_tokens=request.max_new_tokens, seed=request.seed)
            except BackendError as e:
                self.fail_turn(e)
                break
            self.take_turn(gen)
        return self.settle()

    def next_request(self) -> SampleRequest | None:
        """What the agent's next turn asks of the backend, or None when the episode ends or waits for a job
        (the turn is counted and the ledger checked here; ``take_turn`` consumes the answer)."""
        from agent_trainer.outer_loop.episode.ledger import BudgetExhausted

        if self.status != "running" or self.box.done or self.waiting:
            return None
        agent = self.settings.agent
        if self.ledger is not None:
            try:
                self.ledger.check("llm", self.ledger.estimate_llm(self.model_name, self._last_prompt + 512,
                                                                    agent.max_new_tokens), episode=self.id)
            except BudgetExhausted as e:
                self.status = "budget_exhausted"
                self.log({"event": "budget_exhausted", "message": str(e)})
                return None
        if not self.box.next_turn():
            return None
        return SampleRequest(self.messages, self.tool_schemas(), agent.temperature, agent.max_new_tokens,
                           self.seed * TURN_SEED_STRIDE + self.box.state.turns)

    def fail_turn(self, error: Exception) -> None:
        """The backend could not answer the turn: the episode ends as ``backend_error``."""
        self.status = "backend_error"
        self.log({"event": "backend_error", "message": str(error)})

    def take_turn(self, gen) -> None:
        """Record a sampled turn and run its tool calls."""
        self._last_prompt = gen.prompt_tokens
        self.tokens_in += gen.prompt_tokens
        self.tokens_out += gen.completion_tokens
        if self.ledger is not None:
            self.ledger.record_llm(episode=self.id, model=self.model_name, tokens_in=gen.prompt_tokens,
                                   tokens_out=gen.completion_tokens)
        if gen.token_ids and gen.logprobs is not None and gen.prompt_ids is not None:
            self.turns.append(TurnRecord(list(gen.prompt_ids), list(gen.token_ids), list(gen.logprobs),
                                         self.settings.agent.temperature))
        msg = gen.as_message()
        self.messages.append(msg)
        self.log({"event": "message", **msg, "prompt_tokens": gen.prompt_tokens,
                   "completion_tokens": gen.completion_tokens, "token_ids": gen.token_ids,
                   "logprobs": gen.logprobs, "finish_reason": gen.finish_reason})
        if self.steering is not None and self.steering.handle_turn(self, gen):
            return  # the turn answered an open strategy check
        if not gen.tool_calls:
            self._add_message({"role": "user", "content": NO_TOOL_CALL})
            return
        for call in gen.tool_calls:
            before, ran_before = len(self.box.state.pending), len(self.box.state.jobs)
            res = self.box.call(call["name"], call["arguments"])
            if len(self.box.state.pending) > before:
                self._pending_calls[self.box.state.pending[-1].index] = call["id"]
            self._add_message({"role": "tool", "tool_call_id": call["id"], "name": call["name"],
                               "content": res.text}, ok=res.ok)
            if len(self.box.state.jobs) > ran_before:
                self._after_job(self.box.state.jobs[-1])
            if self.box.done or self.waiting:
                break

    def settle(self) -> str:
        """The status once no more turns come: finished, max_jobs or max_turns (unless already ended
        otherwise or waiting for a job)."""
        if self.status == "running" and not self.waiting:
            st = self.box.state
            at_limit = st.submitted >= self.box.limits.max_jobs_per_episode
            self.status = "finished" if st.finished else "max_jobs" if at_limit else "max_turns"
            if self.status == "max_turns" and self.settings.agent.submit_at_turn_limit and not st.submitted:
                self._submit_at_turn_limit()
        return self.status

    def _submit_at_turn_limit(self) -> None:
        """Out of turns with no job submitted: the harness submits the job validate_job last called VALID (if
        unchanged since); deferred, it stays pending for the caller to run, as an episode's last job does."""
        ran_before = len(self.box.state.jobs)
        res = self.box.submit_last_valid()
        if res is None:
            return
        path = self.ws.relative(Path(self.box.state.last_valid[0]))
        self.log({"event": "harness_submit", "path": path, "content": res.text, "ok": res.ok})
        if len(self.box.state.jobs) > ran_before:
            self._after_job(self.box.state.jobs[-1])

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tool schemas given to the backend: full, compact, or None ("names": listed in the system prompt)."""
        if getattr(self.backend, "native_tools", False):
            return self.box.schemas()  # a server with native function calling always gets the full schemas
        return tool_schemas_for(self.box.schemas(), self.settings.agent.tool_schemas)

    @property
    def waiting(self) -> bool:
        """A deferred job was submitted and more may follow: the agent waits for its result (``complete_job``)."""
        return self.status == "running" and bool(self.box.state.pending) and not self.box.done

    def _after_job(self, result) -> None:
        """Job ``len(jobs)`` has its result: log it; the strategy layer's messages go into the conversation."""
        k = len(self.box.state.jobs)
        self.log({"event": "job", "job": k, "status": result.status})
        if self.steering is not None:
            for msg in self.steering.after_job(self, result, live=not self.box.done):
                self._add_message(msg)

    def _add_message(self, msg: dict[str, Any], **extra: Any) -> None:
        self.messages.append(msg)
        self.log({"event": "message", **msg, **extra})

    # --- jobs ----------------------------------------------------------------------------------
    @property
    def pending(self) -> list[PendingJob]:
        return list(self.box.state.pending)

    def complete_job(self, pending: PendingJob, result) -> None:
        """Record a deferred job's result (run by the caller) in the tools' state and the trajectory."""
        resumes = self.waiting  # the agent is waiting for this result before its next job
        res = self.box.complete(pending, result)
        self.log({"event": "job_result", "job": pending.index, "tool_call_id": self._pending_calls.get(pending.index),
                   "content": res.text, "ok": res.ok})
        if resumes:
            self._add_message({"role": "user",
                               "content": f"Result of job {pending.index + 1} ({pending.agent_path}):\n{res.text}"})
        self._after_job(result)

    def run_pending(self, **settings: Any) -> None:
        """Run deferred jobs here, one after the other; ``settings``: ``JobSettings`` fields to change."""
        from agent_trainer.inner_loop.run.job import run_request

        job = self.box.job_settings.replace(**settings)
        for p in self.pending:
            self.complete_job(p, run_request(JobRequest(p.job_dir, self.task, p.output_dir, job)))

    # --- the end -----------------------------------------------------------------------------
    def finish(self) -> EpisodeResult:
        """Compute the staged reward, write summary.json, close the trajectory."""
        st = self.box.state
        stages = staged_reward(st.validation_failures(), st.outcome(self.task, self.settings.strategy.episode_reward),
                               self.settings.reward)
        jobs = [_job_summary(r) for r in st.jobs]
        usd = self.ledger.episode_totals(self.id).usd if self.ledger is not None else 0.0
        result = EpisodeResult(
            episode_id=self.id, task=self.task.name, family=self.task.family, status=self.status,
            reward=stages.to_dict(), turns=self.turns, n_turns=st.turns, jobs=jobs,
            choices=submitted_choices(self.dir / "jobs"), tokens_in=self.tokens_in, tokens_out=self.tokens_out,
            usd=usd, seconds=time.time() - self._t0, strategy=self.strategy_summary(),
            submitted_unfixed=st.submitted_unfixed, harness_submitted=st.harness_submitted,
            refused_calls=st.refused_calls,
        )
        self.log({"event": "reward", **stages.to_dict()})
        self._traj.close()
        tmp = self.dir / "summary.json.tmp"
        tmp.write_text(json.dumps(result.summary(), indent=2, default=str))
        os.replace(tmp, self.dir / "summary.json")
        return result

    def strategy_summary(self) -> dict[str, Any]:
        """Strategy labels of the jobs (from what ran), switch metrics and the steering layer's records."""
        from agent_trainer.outer_loop.strategy.strategy import from_dict, job_labels, sequence_metrics

        jobs = job_labels(self.dir / "jobs")
        out: dict[str, Any] = {"jobs": jobs, **sequence_metrics([from_dict(j["label"]) for j in jobs])}
        if self.steering is not None:
            out["steering"] = self.steering.summary()
        return out

    def log(self, record: dict[str, Any]) -> None:
        """One record (an event or a message) into the episode's trajectory.jsonl, time-stamped."""
        self._traj.write(json.dumps({"t": round(time.time() - self._t0, 3), **record}, default=str) + "\n")
        self._traj.flush()


def reward_metrics(reward: dict[str, Any]) -> dict[str, float]:
    """An episode's staged reward as MLflow metrics ``reward_<stage>`` (weights as ``reward_w_*``, the
    contamination flag as 0/1); the one mapping at-episode, at-fork and at-train's nested runs log."""
    return {f"reward_{k}": float(v) for k, v in reward.items() if isinstance(v, (int, float))}


def play_together(episodes: list[Episode], on_end=None) -> None:
    """Play episodes turn by turn, together: each round, the next turn of every live episode that shares a
    backend is sampled in one call (``AgentBackend.generate_batch``: one padded batch locally, concurrent
    requests to a server), then each episode runs its tool calls. An episode that ends (or waits for a job)
    leaves the rounds, and ``on_end(episode)`` is called then, while the others go on."""
    live = list(episodes)
    while live:
        asked: list[tuple[Episode, SampleRequest]] = []
        for ep in live:
            request = ep.next_request()
            if request is None:
                ep.settle()
                if on_end is not None:
                    on_end(ep)
            else:
                asked.append((ep, request))
        live = [ep for ep, _ in asked]
        by_backend: dict[int, list[tuple[Episode, SampleRequest]]] = {}
        for ep, request in asked:
            by_backend.setdefault(id(ep.backend), []).append((ep, request))
        for pairs in by_backend.values():
            answers = pairs[0][0].backend.generate_batch([r for _, r in pairs])
            for (ep, _), answer in zip(pairs, answers):
                if isinstance(answer, BackendError):
                    ep.fail_turn(answer)
                else:
                    ep.take_turn(answer)


def play_all(episodes: list[Episode], run_jobs, on_end=None) -> None:
    """Play deferred-job episodes to their end, together (``play_together``): whenever some wait for a job's
    result (``Episode.waiting``), ``run_jobs(waiting)`` runs their pending jobs (all at once, e.g. through an
    executor) and completes them, and those episodes go on with the results in their conversation. A job no
    turn waits for (an episode's last) stays pending: ``on_end`` may start it as soon as its episode ends,
    or the caller runs it afterwards (``Rollouts.play`` does one or the other)."""
    play_together(episodes, on_end)
    while waiting := [ep for ep in episodes if ep.waiting]:
        run_jobs(waiting)
        play_together(waiting, on_end)


def compact_tool_schemas(schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas without descriptions: names, argument names and types, required arguments."""
    out = []
    for s in schemas:
        f = s["function"]
        props = {k: {"type": v["type"]} for k, v in f["parameters"]["properties"].items()}
        out.append({"type": "function", "function": {
            "name": f["name"], "parameters": {"type": "object", "properties": props,
                                              "required": list(f["parameters"].get("required", []))}}})
    return out


def _job_summary(result) -> dict[str, Any]:
    keys = ("status", "hidden_score", "baseline", "uplift", "seconds", "usd", "job_hash", "steps", "flagged")
    return {k: getattr(result, k, None) for k in keys}


def submitted_choices(jobs_dir: Path) -> dict[str, Any]:
    """Base model, algorithm and adapter of the last submitted job, read from its snapshot (best effort)."""
    snaps = sorted(Path(jobs_dir).glob("*/job/job.yaml"))
    if not snaps:
        return {}
    try:
        raw = yaml.safe_load(snaps[-1].read_text())
    except yaml.YAMLError:
        return {}
    if not isinstance(raw, dict):
        return {}
    hp = raw.get("hyperparameters") if isinstance(raw.get("hyperparameters"), dict) else {}
    return {"base_model": str(raw.get("base_model")), "algorithm": str(raw.get("algorithm")),
            "peft": "lora" if raw.get("peft") else "full", "learning_rate": hp.get("learning_rate"),
            "max_steps": hp.get("max_steps")}
