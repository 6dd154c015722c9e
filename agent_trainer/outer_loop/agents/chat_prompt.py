"""A text-sampling backend's prompt (local, vllm): the model's own chat template, and a fallback where it drops tools.

    >>> support = template_support(tokenizer)           # probed once per tokenizer: what the template renders
    >>> text = render_prompt(tokenizer, messages, tools, support=support, tool_format="hermes")

``template_support`` renders small probe conversations to find what the template drops (SmolLM2-Instruct's drops
``tools`` and the assistant's ``tool_calls``); ``render_prompt`` moves that into text the template keeps: the
project's tool prompt at the end of the system message, earlier calls written into the assistant's content,
tool results as user turns. A template that renders everything is called as a plain ``apply_chat_template``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from agent_trainer.outer_loop.agents.toolcalls import ToolCallFormat, resolve_format

# Probe names that no real template or conversation contains.
_PROBE_TOOL = "probe_tool_7f3a"
_PROBE_RESULT = "probe_result_7f3a"
_PROBE_CALL = {"id": "call_probe", "type": "function", "function": {"name": _PROBE_TOOL, "arguments": '{"x": 1}'}}
_PROBE_SCHEMA = {"type": "function", "function": {
    "name": _PROBE_TOOL, "description": "a probe", "parameters": {"type": "object", "properties": {"x": {
        "type": "integer"}}, "required": ["x"]}}}
_PROBE_BASE = [{"role": "system", "content": "You are a probe."}, {"role": "user", "content": "Hello."}]


@dataclass(frozen=True)
class TemplateSupport:
    """What a chat template renders of the tool-use parts of a conversation."""

    tools: bool = True          # the ``tools=`` schemas
    tool_calls: bool = True     # an assistant message's ``tool_calls``
    tool_results: bool = True   # ``role: tool`` messages

    @property
    def complete(self) -> bool:
        """True when the template renders everything: prompts are then the template's own, untouched."""
        return self.tools and self.tool_calls and self.tool_results

    def missing(self) -> list[str]:
        """What the template drops, in words."""
        return [what for what, ok in (("tools", self.tools), ("the assistant's tool_calls", self.tool_calls),
                                      ("tool results", self.tool_results)) if not ok]


def _render(tokenizer, messages, tools=None, generation: bool = False, **kwargs) -> str | None:
    """The template's text, or None when it raises (a template that refuses a role or an argument)."""
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation,
                                             tokenize=False, **kwargs)
    except Exception:  # noqa: BLE001 - jinja's TemplateError, a template's raise_exception, a KeyError ...
        return None


def template_support(tokenizer, **chat_template_kwargs: Any) -> TemplateSupport:
    """Probe the tokenizer's chat template: does it render tools (the prompt with a tool schema differs from
    the one without and names the tool), an assistant's tool_calls, and tool results?"""
    with_tools = _render(tokenizer, _PROBE_BASE, [_PROBE_SCHEMA], True, **chat_template_kwargs)
    without = _render(tokenizer, _PROBE_BASE, None, True, **chat_template_kwargs)
    tools = with_tools is not None and with_tools != without and _PROBE_TOOL in with_tools
    call = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}
    called = _render(tokenizer, _PROBE_BASE + [call], **chat_template_kwargs)
    tool_calls = called is not None and _PROBE_TOOL in called
    if not tool_calls:
        call = {"role": "assistant", "content": _PROBE_TOOL}
    answered = _render(tokenizer, _PROBE_BASE + [call, {"role": "tool", "tool_call_id": "call_probe",
                                                        "name": _PROBE_TOOL, "content": _PROBE_RESULT}],
                       **chat_template_kwargs)
    return TemplateSupport(tools=tools, tool_calls=tool_calls,
                           tool_results=answered is not None and _PROBE_RESULT in answered)


def tool_prompt(tools: list[dict[str, Any]], fmt: ToolCallFormat) -> str:
    """The tools as the project's own chat template lists them (``agent_trainer.inner_loop.models.tokenizer``), and how
    to call one in ``fmt``: text for the system message of a template that drops ``tools``."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    if fmt.name == "hermes":
        how = ("For each call, return a json object with the function name and arguments within "
               "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")
    else:
        first = (tools[0].get("function") or tools[0]) if tools else {"name": "name", "parameters": {}}
        example = {"name": first.get("name", "name"),
                   "arguments": {k: "..." for k in (first.get("parameters") or {}).get("required", [])}}
        how = "Write each call like this example:\n" + fmt.render([example])
    return ("# Tools\n\nYou may call one or more functions. Function signatures are within <tools></tools>:\n"
            f"<tools>\n{schemas}\n</tools>\n\n{how}")


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI message's tool_calls as ``{"name", "arguments": dict}`` (what ``ToolCallFormat.render`` takes)."""
    out = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or tc
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            args = {"raw": args}
        out.append({"name": fn.get("name", ""), "arguments": args if isinstance(args, dict) else {"value": args}})
    return out


def adapt_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, support: TemplateSupport,
                   fmt: ToolCallFormat) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` with what the template would drop moved into text it renders (module docstring).
    Unchanged (the very same objects) for a template that renders everything."""
    if support.complete:
        return messages, tools
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and not support.tool_calls and m.get("tool_calls"):
            text = "\n".join(t for t in (m.get("content") or "", fmt.render(_calls(m))) if t)
            m = {k: v for k, v in m.items() if k != "tool_calls"} | {"content": text}
        elif role == "tool" and not support.tool_results:
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    if tools and not support.tools:
        prompt = tool_prompt(tools, fmt)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
        tools = None
    return out, tools


def render_prompt(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                  support: TemplateSupport, tool_format: str | None = None,
                  chat_template_kwargs: dict[str, Any] | None = None,
                  warn: Callable[[str], None] | None = None) -> str:
    """The chat-template prompt that ends with the assistant header; ``warn(message)`` is called when the
    conversation had to be adapted (the backend says it once)."""
    fmt = resolve_format(tool_format, getattr(tokenizer, "chat_template", None))
    if not support.complete and warn is not None and (tools or any(
            m.get("tool_calls") or m.get("role") == "tool" for m in messages)):
        missing = support.missing()
        what = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
        warn(f"the agent's chat template drops {what}; the project's tool prompt goes "
             f"into the system message, and calls and results into the turns' text ({fmt.name} format; "
             f"agent_trainer.outer_loop.agents.chat_prompt)")
    messages, tools = adapt_messages(messages, tools, support, fmt)
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False,
                                         **(chat_template_kwargs or {}))
