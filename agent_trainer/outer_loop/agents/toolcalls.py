"""Tool-call text formats by name: parse a sampled assistant turn into calls, and render calls back as text.

    >>> from agent_trainer.outer_loop.agents.toolcalls import TOOL_CALL_FORMATS, detect_format
    >>> fmt = TOOL_CALL_FORMATS[detect_format(tokenizer.chat_template)]  # "hermes" for the tiny agent
    >>> content, calls, errors = fmt.parse(text)
    >>> calls      # [{"id": "call_...", "name": "read_file", "arguments": {"path": "GUIDE.md"}}]
    >>> fmt.render([{"name": "read_file", "arguments": {"path": "GUIDE.md"}}])   # the turn as that model writes it

Formats: ``hermes``, ``llama3``, ``mistral``, ``qwen3_coder``; OpenAI-native ``tool_calls`` go through
``parse_openai_tool_calls``. Parsers never raise: a malformed call stays in ``content`` and ``errors`` says why.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from agent_trainer.registry import Registry

Call = dict[str, Any]


class ParsedCalls(NamedTuple):
    """What a parser found: the text left for the agent, the calls, and one message per malformed call."""

    content: str
    calls: list[Call]
    errors: list[str]


@dataclass(frozen=True)
class ToolCallFormat:
    """One way of writing tool calls in text: ``parse(text)`` and its inverse ``render(calls)``."""

    name: str
    parse: Callable[[str], ParsedCalls]
    render: Callable[[list[Call]], str]
    description: str = ""


TOOL_CALL_FORMATS: Registry[ToolCallFormat] = Registry(
    "tool-call format", hint="set agent.tool_format to one of them, or auto (chosen from the chat template)")
AUTO = "auto"
_DECODE_DEPTH = 3  # "arguments" as a JSON string of a JSON string ...: models double-encode, deeper is garbage


# --- shared checks ------------------------------------------------------------------------

def _call_id(text: str, index: int) -> str:
    # Deterministic ids keep trajectories of the same seed identical; uniqueness within a turn is enough.
    # surrogatepass: garbage text with a lone surrogate still gets an id (valid text hashes as before).
    return "call_" + hashlib.sha1(f"{index}\x00{text}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


def utf8_clean(*values: Any) -> bool:
    """False when a value holds a lone surrogate (JSON ``"\\ud800"``): it cannot be re-encoded as UTF-8,
    so it would break the chat template of the next turn; such a call is treated as no call."""
    try:
        json.dumps(values, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, RecursionError):
        return False
    return True


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _arguments(args: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``args`` as a dict (JSON strings decoded, an empty string is ``{}``), or ``(None, why not)``."""
    for _ in range(_DECODE_DEPTH):
        if not isinstance(args, str):
            break
        if not args.strip():
            return {}, None
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):  # not JSON, a huge number, nesting too deep
            return None, "arguments are a string that is not JSON"
    if not isinstance(args, dict):
        return None, f"arguments must be a JSON object, got {_kind(args)}"
    return args, None


def make_call(name: Any, args: Any) -> tuple[Call | None, str | None]:
    """A checked call ``{"name", "arguments"}`` (no id yet), or ``(None, error)`` naming the call and the fault."""
    if not isinstance(name, str) or not name:
        return None, f"bad tool call: the name must be a non-empty string, got {_kind(name)}"
    args, why = _arguments(args)
    if args is None:
        return None, f"bad tool call {name!r}: {why}"
    if not utf8_clean(name, args):
        return None, f"bad tool call {name!r}: it holds invalid Unicode (a lone surrogate)"
    return {"name": name, "arguments": args}, None


def _json_calls(obj: Any, keys: tuple[str, ...]) -> tuple[list[Call], list[str]]:
    """Calls from a decoded JSON call object or list of them; ``keys``: where the arguments may be."""
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        return [], ["bad tool call: an empty list of calls"]
    calls, errors = [], []
    for item in items:
        if not isinstance(item, dict):
            errors.append(f"bad tool call: expected an object with name and arguments, got {_kind(item)}")
            continue
        key = next((k for k in keys if k in item), None)
        call, err = make_call(item.get("name"), item[key] if key else {})
        calls += [call] if call else []
        errors += [err] if err else []
    return calls, errors


def _assemble(text: str, found: list[tuple[int, int, list[Call]]], errors: list[str]) -> ParsedCalls:
    """Cut the spans of accepted calls out of ``text``; ids are numbered in order of appearance."""
    calls: list[Call] = []
    kept: list[str] = []
    pos = 0
    for start, end, block in sorted(found, key=lambda f: f[0]):
        kept.append(text[pos:max(pos, start)])
        pos = max(pos, end)
        for call in block:
            call["id"] = _call_id(text, len(calls))
            calls.append(call)
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text.strip()
    return ParsedCalls(content, calls, errors)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- hermes -------------------------------------------------------------------------------

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _hermes_body(body: str) -> tuple[list[Call], list[str]]:
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError):
        return [], ["bad tool call: a <tool_call> block that is not valid JSON"]
    return _json_calls(obj, ("arguments",))


def _parse_blocks(text: str, body) -> ParsedCalls:
    """The calls of every ``<tool_call>`` block, read by ``body``; a block with any malformed call is no call."""
    found, errors = [], []
    for m in _TOOL_CALL.finditer(text):
        calls, errs = body(m.group(1))
        errors += errs
        if calls and not errs:
            found.append((m.start(), m.end(), calls))
    return _assemble(text, found, errors)


def parse_hermes(text: str) -> ParsedCalls:
    """``<tool_call>{json call or list of calls}</tool_call>``; the closing tag may be missing at the end.
    A block with any malformed call is no call at all (it stays in the content)."""
    return _parse_blocks(text, _hermes_body)


def render_hermes(calls: list[Call]) -> str:
    """As the tiny agent's (Qwen3's) chat template writes an assistant's calls."""
    return "\n".join(f'<tool_call>\n{{"name": {_dumps(c["name"])}, "arguments": {_dumps(c["arguments"])}}}'
                     "\n</tool_call>" for c in calls)


# --- llama3 -------------------------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"
# A JSON call starts the text, a line, or follows the python tag or a ';'.
_LLAMA_START = re.compile(r"(?:\A|\n|;|<\|python_tag\|>)[ \t\r]*(?=[\[{])")
_LLAMA_AFTER = re.compile(r"(?:\s|;|<\|eom_id\|>|<\|eot_id\|>)*")
_ATTEMPTS = 256  # JSON decodes tried per text: a bound on garbage such as "[\n" * 10**5
_DECODER = json.JSONDecoder()


def _back_over_tag(text: str, start: int) -> int:
    """Where a call at ``start`` begins with the whitespace and ``<|python_tag|>`` before it."""
    while True:
        i = start
        while i > 0 and text[i - 1].isspace():
            i -= 1
        if i >= len(_PYTHON_TAG) and text.startswith(_PYTHON_TAG, i - len(_PYTHON_TAG)):
            i -= len(_PYTHON_TAG)
        if i == start:
            return start
        start = i


def _is_llama_call(obj: Any) -> bool:
    return isinstance(obj, dict) and "name" in obj and ("parameters" in obj or "arguments" in obj)


def parse_llama3(text: str) -> ParsedCalls:
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}`` (or ``arguments``) at the start of the
    text or of a line, or after ``<|python_tag|>`` or ``;``; a JSON list of such calls too. JSON that has
    no call's keys is plain content."""
    found, errors = [], []
    scan = 0
    for _ in range(_ATTEMPTS):
        m = _LLAMA_START.search(text, scan)
        if m is None:
            break
        start = m.end()
        try:
            obj, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            scan = start + 1
            continue
        scan = end
        items = obj if isinstance(obj, list) else [obj]
        if not items or not any(_is_llama_call(i) for i in items):
            continue  # JSON the model wrote as an answer, not a call
        calls, errs = _json_calls(obj, ("parameters", "arguments"))
        errors += errs
        if calls and not errs:
            found.append((_back_over_tag(text, start), _LLAMA_AFTER.match(text, end).end(), calls))
    return _assemble(text, found, errors)


def render_llama3(calls: list[Call]) -> str:
    """As Llama 3.1's chat template writes custom-tool calls, one per line."""
    return "\n".join(f'{{"name": {_dumps(c["name"])}, "parameters": {_dumps(c["arguments"])}}}' for c in calls)


# --- mistral ------------------------------------------------------------------------------

_TOOL_CALLS = "[TOOL_CALLS]"
_MISTRAL_NAMED = re.compile(r"\s*([^\s\[\]{}]+)\s*(?:\[CALL_ID\]\s*[^\s\[]*\s*)?\[ARGS\]\s*")
_SPACE = re.compile(r"\s*")


def parse_mistral(text: str) -> ParsedCalls:
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers) and ``[TOOL_CALLS]name[ARGS]{...}``
    (v11+, one marker per call, an optional ``[CALL_ID]id`` before ``[ARGS]``)."""
    found, errors = [], []
    start = text.find(_TOOL_CALLS)
    for _ in range(_ATTEMPTS):
        if start == -1:
            break
        pos = start + len(_TOOL_CALLS)
        named = _MISTRAL_NAMED.match(text, pos)
        try:
            if named:
                args, end = _DECODER.raw_decode(text, named.end())
                call, err = make_call(named.group(1), args)
                calls, errs = ([call], []) if call else ([], [err])
            else:
                obj, end = _DECODER.raw_decode(text, _SPACE.match(text, pos).end())
                calls, errs = _json_calls(obj, ("arguments",))
        except (ValueError, RecursionError):
            errors.append("bad tool call: [TOOL_CALLS] is not followed by a JSON call list or name[ARGS]{...}")
            start = text.find(_TOOL_CALLS, pos)
            continue
        errors += errs
        if calls and not errs:
            found.append((start, end, calls))
        start = text.find(_TOOL_CALLS, end)
    return _assemble(text, found, errors)


def render_mistral(calls: list[Call]) -> str:
    """The v3 list form, which every Mistral tool-call parser reads."""
    return _TOOL_CALLS + _dumps([{"name": c["name"], "arguments": c["arguments"]} for c in calls])


# --- qwen3_coder --------------------------------------------------------------------------

_FUNCTION = re.compile(r"<function=([^<>\n]*)>(.*?)(?:</function>|(?=<function=)|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^<>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def _xml_value(raw: str) -> Any:
    """A parameter's text, less the newline the template writes on each side; JSON objects, lists, numbers
    and booleans decoded (everything else, "null" included, stays a string)."""
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    s = value.strip()
    if s and (s[0] in "{[-0123456789" or s in ("true", "false")):
        try:
            decoded = json.loads(s)
        except (ValueError, RecursionError):
            return value
        if isinstance(decoded, (dict, list, bool, int)) or (isinstance(decoded, float) and math.isfinite(decoded)):
            return decoded
    return value


def _qwen3_coder_body(body: str) -> tuple[list[Call], list[str]]:
    functions = list(_FUNCTION.finditer(body))
    if not functions:  # the model fell back to Hermes JSON inside the tags
        return _hermes_body(body)
    calls, errors = [], []
    for f in functions:
        args = {p.group(1).strip(): _xml_value(p.group(2)) for p in _PARAMETER.finditer(f.group(2))}
        call, err = make_call(f.group(1).strip(), args)
        calls += [call] if call else []
        errors += [err] if err else []
    return calls, errors


def parse_qwen3_coder(text: str) -> ParsedCalls:
    """``<tool_call><function=name><parameter=key>value</parameter>...</function></tool_call>``; closing tags
    may be missing at the end; a block holding Hermes JSON instead is read as Hermes."""
    return _parse_blocks(text, _qwen3_coder_body)


def _xml_text(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value)


def render_qwen3_coder(calls: list[Call]) -> str:
    """As Qwen3-Coder's chat template writes calls. Values are text: a string that reads as JSON (``"42"``)
    parses back decoded, and null parses back as the string ``"null"``."""
    return "\n".join(
        f"<tool_call>\n<function={c['name']}>\n"
        + "".join(f"<parameter={k}>\n{_xml_text(v)}\n</parameter>\n" for k, v in c["arguments"].items())
        + "</function>\n</tool_call>"
        for c in calls)


for _fmt in (
    ToolCallFormat("hermes", parse_hermes, render_hermes, "<tool_call>{json}</tool_call> (Hermes, Qwen, SmolLM2)"),
    ToolCallFormat("llama3", parse_llama3, render_llama3, '{"name", "parameters"} JSON (Llama 3.x)'),
    ToolCallFormat("mistral", parse_mistral, render_mistral, "[TOOL_CALLS][...] or [TOOL_CALLS]name[ARGS]{...}"),
    ToolCallFormat("qwen3_coder", parse_qwen3_coder, render_qwen3_coder, "<function=name><parameter=k> XML"),
):
    TOOL_CALL_FORMATS.register(_fmt.name, _fmt)


# --- OpenAI-native tool_calls ---------------------------------------------------------------

def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def parse_openai_tool_calls(tool_calls: list[Any] | None, content: str | None = "") -> ParsedCalls:
    """Calls from an OpenAI message's ``tool_calls`` (dicts or SDK objects: ``{"id", "type": "function",
    "function": {"name", "arguments": <JSON string>}}``); the server's ids are kept (one missing or repeated
    is replaced). A bad call is written into ``content`` as Hermes text, so the agent sees what it asked for,
    and explained in ``errors``."""
    calls, bad, errors = [], [], []
    for i, tc in enumerate(tool_calls or []):
        fn = _field(tc, "function")
        if fn is None:
            errors.append(f"bad tool call {i}: no function in it")
            continue
        name, raw = _field(fn, "name"), _field(fn, "arguments")
        call, err = make_call(name, raw if raw is not None else {})
        if call is None:
            text_args = raw if isinstance(raw, str) else json.dumps(raw, default=str)
            note = f'<tool_call>{{"name": {json.dumps(name, default=str)}, "arguments": {text_args}}}</tool_call>'
            bad.append(note.encode("utf-8", "backslashreplace").decode("utf-8"))  # no lone surrogate into the chat
            errors.append(err)
            continue
        server_id = _field(tc, "id")
        fresh = isinstance(server_id, str) and server_id and all(c["id"] != server_id for c in calls)
        call["id"] = server_id if fresh else _call_id(name, i)  # a missing or repeated id would mismatch answers
        calls.append(call)
    return ParsedCalls("\n".join([content or "", *bad]).strip(), calls, errors)


def to_openai_tool_calls(calls: list[Call]) -> list[dict[str, Any]]:
    """The inverse of ``parse_openai_tool_calls``: OpenAI ``tool_calls`` with arguments as JSON strings."""
    return [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _dumps(c["arguments"])}}
            for c in calls]


# --- choosing a format --------------------------------------------------------------------

def _template_text(chat_template: Any) -> str:
    if isinstance(chat_template, dict):  # named templates ("default", "tool_use")
        return "\n".join(str(t) for t in chat_template.values())
    if isinstance(chat_template, list):  # [{"name", "template"}] as saved in tokenizer_config.json
        return "\n".join(str(_field(t, "template") or "") for t in chat_template)
    return chat_template if isinstance(chat_template, str) else ""


def detect_format(chat_template: str | dict | list | None) -> str:
    """The format a tokenizer's chat template teaches its model (the template text, or its named templates);
    ``hermes`` when nothing in it says otherwise."""
    t = _template_text(chat_template)
    if "<tool_call>" in t:
        return "qwen3_coder" if "<function=" in t else "hermes"
    if _TOOL_CALLS in t:
        return "mistral"
    if _PYTHON_TAG in t or ("<|start_header_id|>" in t and '"parameters"' in t):
        return "llama3"
    return "hermes"


def resolve_format(name: str | None, chat_template: Any = None) -> ToolCallFormat:
    """The format ``name`` (``agent.tool_format``), or for ``auto``/None the one ``detect_format`` picks;
    an unknown name raises the registry's error listing the known ones."""
    if name is None or name == AUTO:
        name = detect_format(chat_template)
    return TOOL_CALL_FORMATS[name]
