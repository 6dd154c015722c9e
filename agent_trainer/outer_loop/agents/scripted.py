"""Scripted agents: a script of tool calls played as an agent backend, so a person's job or the scripted novice
(the agents' teacher) plays the same episodes as a trained agent, on the same tasks, seeds, tools and budget.

    >>> policy = ScriptedPolicy(tasks, novice_script, "novice")              # the warm starts' teacher
    >>> policy = ScriptedPolicy(tasks, job_script({"calc_chain": {"job.yaml": "..."}}), "handwritten")
    >>> Rollouts(policy, ...).play(tasks, 4, step, "heldout", seed_base=heldout.SEED_BASE)

A script is ``script(task, rng)``: a generator of tool calls ``{"name", "arguments"}``, sent back each call's
result as ``{"ok": bool, "text": str}`` (the novice's protocol, ``agent_trainer.outer_loop.agents.novice``). The
backend keeps no state: each turn it starts the episode's script again with ``random.Random(<episode seed>)`` and
replays the tool results already in the conversation, so episodes played together in one batch stay apart and the
same episode seed gives the same calls. The episode seed is the turn seed's quotient by ``TURN_SEED_STRIDE``
(``agent_trainer.outer_loop.episode.episode``). A script's turns cost no tokens; a finished script says ``finish``.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Generator, Mapping, Sequence

from agent_trainer.config import AgentConfig
from agent_trainer.outer_loop.agents.base import AgentBackend, BackendError, Generation

Script = Callable[[Any, random.Random], Generator[dict, Any, None]]


def novice_script(task, rng: random.Random) -> Generator[dict, Any, None]:
    """The scripted novice the tiny agent and SmolLM2 agents were warm-started on (its prior, mistakes, fixes)."""
    from agent_trainer.outer_loop.agents.novice import novice_episode

    return novice_episode(task, rng)


def job_script(files_by_family: Mapping[str, Mapping[str, str]]) -> Script:
    """A script that writes the family's job files (``{path: content}``, ``job.yaml`` among them) in one turn,
    validates and submits them: a person's job, the same for every episode of the family."""
    def script(task, rng: random.Random) -> Generator[dict, Any, None]:
        files = files_by_family.get(task.family)
        if files is None:
            raise BackendError(f"no hand-written job for family {task.family} (have {sorted(files_by_family)})")
        calls = [{"name": "write_file", "arguments": {"path": p, "content": c}} for p, c in files.items()]
        yield {"turn": calls + [{"name": "validate_job", "arguments": {"path": "job.yaml"}},
                                {"name": "submit_job", "arguments": {"path": "job.yaml"}}]}
    return script


class ScriptedPolicy(AgentBackend):
    """An agent backend whose turns a script writes (see the module docstring); ``tasks``: the tasks it may be
    given (an episode's task is found by its opening message)."""

    def __init__(self, tasks: Sequence, script: Script, model_name: str):
        from agent_trainer.outer_loop.episode.episode import task_message

        self.script, self.model_name = script, model_name
        self.tasks = {task_message(t): t for t in tasks}

    def generate(self, messages: list[dict[str, Any]], tools=None, *, temperature: float = AgentConfig.temperature,
                 max_new_tokens: int = AgentConfig.max_new_tokens, seed: int | None = None) -> Generation:
        from agent_trainer.outer_loop.episode.episode import TURN_SEED_STRIDE

        task = next((self.tasks[m["content"]] for m in messages if m.get("role") == "user"
                     and m.get("content") in self.tasks), None)
        if task is None:
            raise BackendError(f"{self.model_name}: the conversation opens with a task it was not given")
        calls = self._next(task, random.Random((seed or 0) // TURN_SEED_STRIDE), messages)
        calls = [{"id": f"call_{i}", **c} for i, c in enumerate(calls)]
        return Generation(text="", tool_calls=calls, finish_reason="tool_calls")

    def _next(self, task, rng: random.Random, messages: list[dict[str, Any]]) -> list[dict]:
        """The script's next turn after the turns already in ``messages`` (each turn's last tool result sent
        back)."""
        results: list[str] = []
        for m in messages:
            if m.get("role") == "assistant":
                results.append("")
            elif m.get("role") == "tool" and results:
                results[-1] = m.get("content") or ""
        script = self.script(task, rng)
        try:
            step = next(script)
            for text in results:
                step = script.send({"ok": ": VALID (" in text.split("\n", 1)[0], "text": text})
        except StopIteration:
            return [{"name": "finish", "arguments": {"summary": "script over"}}]
        return list(step["turn"]) if "turn" in step else [step]
