"""Task specs: the JSON files in ``examples/tasks/`` that say what an agent is asked to do.

    >>> from agent_trainer.evaluation.tasks import load_task
    >>> spec = load_task("examples/tasks/calc_chain_v1_fast.json")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_trainer.evaluation.families import FAMILIES, CardError, FamilyError, get_family


class TaskSpecError(ValueError):
    """A task spec that cannot be used; the message names the file, the field and the fix."""


class InnerBudget(BaseModel):
    """What one inner job may spend."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a NaN or inf budget disables the cap

    max_steps: int = Field(200, ge=1, le=100_000, description="optimizer steps per inner job")
    max_seconds: float = Field(90.0, gt=0, le=86_400, description="compute per inner job, in the cost model's "
                               "seconds (agent_trainer.inner_loop.spec.cost): estimated before the job runs, the "
                               "same on every machine; the wall clock is only a safety cap (inner.timeout_s)")
    max_usd: float = Field(0.05, ge=0, description="estimated cost cap per inner job, USD")


class TaskSpec(BaseModel):
    """A training task for the agent: which family, which base models, what budget."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="unique task name, e.g. calc_chain_v1_fast")
    family: str = Field(description="task family from the registry")
    version: int = Field(1, ge=1, description="family version; the hidden set changes only with it")
    instruction: str | None = Field(None, description="what the agent reads; defaults to the family's")
    allowed_base_models: list[str] = Field(default_factory=lambda: ["tiny-s", "tiny-m"], min_length=1)
    budget: InnerBudget = Field(default_factory=InnerBudget)
    hidden_eval_size: int = Field(200, ge=1, le=5000)
    held_out: bool | None = Field(None, description="defaults to the family's own flag")
    prompt_format: Literal["raw", "chat"] = Field("raw", description="how models see prompts: raw (the family's "
                                                  "text) or chat (the model's chat template); "
                                                  "agent_trainer.evaluation.prompts")
    system_prompt: str | None = Field(None, description="chat: the system message; null = the instruction + "
                                                        "'Answer with the answer only.', '' = none")

    @model_validator(mode="after")
    def _check_family(self) -> "TaskSpec":
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; known: {', '.join(sorted(FAMILIES))}")
        fam = get_family(self.family)
        if self.version != fam.version:
            raise ValueError(f"family {self.family!r} is at version {fam.version}, the spec says {self.version}")
        if self.instruction is None:
            self.instruction = fam.instruction
        if self.held_out is None:
            self.held_out = fam.held_out
        return self


def load_task(path: str | Path) -> TaskSpec:
    """Read and validate a task spec; raises ``TaskSpecError`` with one readable line per problem."""
    p = Path(path)
    if not p.is_file():
        raise TaskSpecError(f"task spec {str(p)!r} not found; task specs live in examples/tasks/*.json")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise TaskSpecError(f"task spec {p}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise TaskSpecError(f"task spec {p}: not valid JSON ({e})") from None
    except RecursionError:
        raise TaskSpecError(f"task spec {p}: nested too deeply to be a task spec") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise TaskSpecError(f"task spec {p}: a value cannot be read ({str(e).split(';')[0]})") from None
    except OSError as e:
        raise TaskSpecError(f"task spec {p}: cannot be read ({e.strerror or e})") from None
    return parse_task(raw, source=str(p))


def parse_task(raw: object, source: str = "<task>") -> TaskSpec:
    """Validate an already-parsed task spec."""
    try:
        return TaskSpec.model_validate(raw)
    except ValidationError as e:
        for err in e.errors():   # a broken card that the family lookup loaded: its own error, not the spec's
            if isinstance((err.get("ctx") or {}).get("error"), CardError):
                raise err["ctx"]["error"] from None
        lines = [f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in e.errors()]
        raise TaskSpecError(f"task spec {source} is invalid: " + "; ".join(lines)) from None
    except CardError:
        raise
    except FamilyError as e:
        raise TaskSpecError(f"task spec {source} is invalid: {e}") from None
    except RecursionError:
        raise TaskSpecError(f"task spec {source} is nested too deeply to be a task spec") from None
