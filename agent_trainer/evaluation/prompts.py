"""How a model sees a prompt: ``raw`` (the family's text, for base models) or ``chat`` (its chat template).

    >>> from agent_trainer.evaluation.prompts import PromptFormat, render
    >>> fmt = PromptFormat("chat", system="Evaluate the expression. Answer with the answer only.")
    >>> render(tokenizer, "calc: 11-3-3=", fmt)
    '<|im_start|>system\\nEvaluate ...<|im_end|>\\n<|im_start|>user\\ncalc: 11-3-3=<|im_end|>\\n<|im_start|>assistant...'

The same rendering serves the hidden evaluation, the baselines (cached per format), and the rows an
inner job trains on (SFT prompts, GRPO prompts, DPO prompts: ``agent_trainer.inner_loop.train.stages``): a task
spec's ``prompt_format`` (default ``raw``) and ``system_prompt`` (default: the family's instruction and
"Answer with the answer only.") decide it for every one of them. The answer always follows the
rendered prompt directly and ends with the tokenizer's eos (``<|im_end|>`` for ChatML models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FORMATS = ("raw", "chat")
ANSWER_ONLY = "Answer with the answer only."


class PromptFormatError(ValueError):
    """A prompt format the model cannot take (no chat template); the message says what to do."""


@dataclass(frozen=True)
class PromptFormat:
    """``raw`` or ``chat`` (with its system prompt; None: no system message)."""

    kind: Literal["raw", "chat"] = "raw"
    system: str | None = None

    @property
    def key(self) -> str:
        """A short, stable name for caches and logs (``raw``, ``chat`` or ``chat:<hash of the system prompt>``)."""
        if self.kind == "raw":
            return "raw"
        if not self.system:
            return "chat"
        import hashlib

        return "chat:" + hashlib.sha256(self.system.encode()).hexdigest()[:12]

    def as_args(self) -> list[str]:
        """Command-line arguments of ``agent_trainer.inner_loop.run.worker`` for this format."""
        return [] if self.kind == "raw" else ["--prompt-format", self.kind, *(["--system-prompt", self.system]
                                                                             if self.system else [])]


RAW = PromptFormat()


def for_task(task) -> PromptFormat:
    """The prompt format of a task spec (``agent_trainer.evaluation.tasks.TaskSpec``)."""
    if getattr(task, "prompt_format", "raw") == "raw":
        return RAW
    system = task.system_prompt if task.system_prompt is not None else f"{task.instruction} {ANSWER_ONLY}"
    return PromptFormat("chat", system or None)


def for_family(family: str, kind: str = "raw") -> PromptFormat:
    """The default format ``kind`` for a family's task: chat with the family's instruction as system prompt."""
    if kind == "raw":
        return RAW
    from agent_trainer.evaluation.families import get_family

    return PromptFormat("chat", f"{get_family(family).instruction} {ANSWER_ONLY}")


def render(tokenizer, prompt: str, fmt: PromptFormat = RAW) -> str:
    """``prompt`` as the model reads it in format ``fmt``."""
    if fmt.kind == "raw":
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise PromptFormatError("the model's tokenizer has no chat template; use prompt_format raw for it")
    messages = [{"role": "system", "content": fmt.system}] if fmt.system else []
    messages.append({"role": "user", "content": prompt})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
