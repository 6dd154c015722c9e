"""Tool-call formats (agent_trainer.outer_loop.agents.toolcalls): each parser on text as the models write it, render ->
parse round trips, format detection from chat templates, and >= 500 seeded garbage inputs per parser.

    pytest -q tests/unit/test_toolcall_formats.py
"""

from __future__ import annotations

import json
import random
import time
from types import SimpleNamespace

import pytest

from agent_trainer.registry import UnknownName
from agent_trainer.inner_loop.models.tokenizer import CHAT_TEMPLATE
from agent_trainer.outer_loop.agents import make_backend, parse_tool_calls
from agent_trainer.outer_loop.agents.base import AgentBackend, Generation
from agent_trainer.outer_loop.agents.toolcalls import (
    TOOL_CALL_FORMATS, ParsedCalls, detect_format, parse_openai_tool_calls, resolve_format, to_openai_tool_calls,
)

FORMATS = ("hermes", "llama3", "mistral", "qwen3_coder")


def parse(fmt: str, text: str) -> ParsedCalls:
    return TOOL_CALL_FORMATS[fmt].parse(text)


def named(calls) -> list[tuple[str, dict]]:
    return [(c["name"], c["arguments"]) for c in calls]


def check_shape(parsed, text: str | None = None, id_prefix: str = "call_") -> None:
    """The documented result: ParsedCalls of (str, well-formed calls with unique ids, str errors)."""
    assert isinstance(parsed, ParsedCalls) and isinstance(parsed.content, str)
    assert isinstance(parsed.calls, list) and isinstance(parsed.errors, list)
    assert all(isinstance(e, str) and e for e in parsed.errors)
    for c in parsed.calls:
        assert set(c) == {"id", "name", "arguments"}
        assert isinstance(c["name"], str) and c["name"] and isinstance(c["arguments"], dict)
        assert isinstance(c["id"], str) and c["id"].startswith(id_prefix)
    assert len({c["id"] for c in parsed.calls}) == len(parsed.calls)
    if text is not None and not parsed.calls:
        assert parsed.content == text.strip()  # no call: the agent's text is left as it wrote it
    msg = Generation(text=parsed.content, tool_calls=parsed.calls).as_message()
    json.dumps(msg)  # the turn goes into the trajectory file; the calls' arguments also into the chat template:
    for tc in msg.get("tool_calls", []):
        assert isinstance(json.loads(tc["function"]["arguments"].encode("utf-8")), dict)
        tc["function"]["name"].encode("utf-8")


# --- each format on real model output ---------------------------------------------------------

def test_hermes_qwen_block_smollm2_list_and_unclosed_tag():
    qwen = ('Let me read the guide.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "GUIDE.md"}}\n'
            '</tool_call>')
    p = parse("hermes", qwen)
    assert p.content == "Let me read the guide." and named(p.calls) == [("read_file", {"path": "GUIDE.md"})]
    smol = ('<tool_call>[{"name": "read_file", "arguments": {"path": "GUIDE.md"}}, '
            '{"name": "validate_job", "arguments": {}}]</tool_call>')
    p = parse("hermes", smol)
    assert named(p.calls) == [("read_file", {"path": "GUIDE.md"}), ("validate_job", {})] and p.content == ""
    assert p.calls[0]["id"] != p.calls[1]["id"]
    stopped = '<tool_call>\n{"name": "finish", "arguments": {"summary": "done"}}\n'  # stopped on </tool_call>
    p = parse("hermes", stopped)
    assert named(p.calls) == [("finish", {"summary": "done"})] and not p.errors


def test_hermes_keeps_the_old_entry_point():
    text = '<tool_call>{"name": "finish"}</tool_call> <tool_call>{"name": "f", "arguments": [1]}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert named(calls) == [("finish", {})] and content == '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'
    assert (content, calls) == parse("hermes", text)[:2]
    assert parse_tool_calls('[TOOL_CALLS][{"name": "f", "arguments": {}}]', "mistral")[1][0]["name"] == "f"


def test_llama3_python_tag_parameters_lists_and_semicolons():
    p = parse("llama3", '<|python_tag|>{"name": "read_file", "parameters": {"path": "GUIDE.md"}}<|eom_id|>')
    assert named(p.calls) == [("read_file", {"path": "GUIDE.md"})] and p.content == ""
    p = parse("llama3", 'I will check first.\n{"name": "read_file", "parameters": {"path": "a.txt"}}\n'
                        '{"name": "validate_job", "parameters": {}}')
    assert [c["name"] for c in p.calls] == ["read_file", "validate_job"] and p.content == "I will check first."
    p = parse("llama3", '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": "{\\"y\\": 2}"}')
    assert named(p.calls) == [("a", {"x": 1}), ("b", {"y": 2})] and p.content == ""
    p = parse("llama3", '[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {"k": [1, 2]}}]')
    assert named(p.calls) == [("a", {}), ("b", {"k": [1, 2]})]
    answer = 'The result is:\n{"answer": 16, "name": "calc"}'  # JSON as an answer, not a call
    assert parse("llama3", answer) == ParsedCalls(answer, [], [])


def test_mistral_list_form_and_name_args_form():
    p = parse("mistral", '[TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "GUIDE.md"}, "id": "a1B2c3D4e"}]')
    assert named(p.calls) == [("read_file", {"path": "GUIDE.md"})] and p.content == ""
    p = parse("mistral", 'Checking.[TOOL_CALLS]read_file[ARGS]{"path": "GUIDE.md"}'
                         '[TOOL_CALLS]validate_job[CALL_ID]9bT4kLm2q[ARGS]{}')
    assert named(p.calls) == [("read_file", {"path": "GUIDE.md"}), ("validate_job", {})] and p.content == "Checking."
    truncated = '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "GU'
    p = parse("mistral", truncated)
    assert p.calls == [] and p.content == truncated and "[TOOL_CALLS]" in p.errors[0]


def test_qwen3_coder_xml_with_typed_values():
    text = ("I'll write the job.\n<tool_call>\n<function=write_file>\n<parameter=path>\njob.yaml\n</parameter>\n"
            "<parameter=content>\nbase_model: tiny-s\nseed: 0\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=configure>\n<parameter=steps>\n150\n</parameter>\n<parameter=lr>\n1e-3\n"
            "</parameter>\n<parameter=peft>\n{\"r\": 16}\n</parameter>\n"
            "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
            "<parameter=fast>\ntrue\n</parameter>\n<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>")
    p = parse("qwen3_coder", text)
    assert p.content == "I'll write the job." and not p.errors
    assert named(p.calls) == [("write_file", {"path": "job.yaml", "content": "base_model: tiny-s\nseed: 0"}),
                              ("configure", {"steps": 150, "lr": 1e-3, "peft": {"r": 16}, "tags": ["a", "b"],
                                             "fast": True, "note": "null"})]
    unclosed = "<tool_call>\n<function=read_file>\n<parameter=path>\nGUIDE.md\n"  # generation stopped early
    assert named(parse("qwen3_coder", unclosed).calls) == [("read_file", {"path": "GUIDE.md"})]
    hermes_inside = '<tool_call>\n{"name": "finish", "arguments": {"summary": "ok"}}\n</tool_call>'
    assert named(parse("qwen3_coder", hermes_inside).calls) == [("finish", {"summary": "ok"})]


def test_openai_objects_with_string_and_double_encoded_arguments():
    sdk = [SimpleNamespace(id="call_abc", type="function",
                           function=SimpleNamespace(name="read_file", arguments='{"path": "GUIDE.md"}')),
           {"id": None, "type": "function",
            "function": {"name": "write_file", "arguments": json.dumps(json.dumps({"path": "job.yaml"}))}},
           {"type": "function", "function": {"name": "validate_job", "arguments": ""}}]
    p = parse_openai_tool_calls(sdk, "ok")
    assert named(p.calls) == [("read_file", {"path": "GUIDE.md"}), ("write_file", {"path": "job.yaml"}),
                              ("validate_job", {})]
    assert p.calls[0]["id"] == "call_abc" and p.calls[1]["id"].startswith("call_") and p.content == "ok"
    assert [json.loads(t["function"]["arguments"]) for t in to_openai_tool_calls(p.calls)] == \
        [c["arguments"] for c in p.calls]
    bad = parse_openai_tool_calls([{"id": "x", "function": {"name": "f", "arguments": "[1, 2]"}},
                                   {"id": "y", "function": {"name": "g", "arguments": "{oops"}},
                                   {"id": "z"}], "")
    assert bad.calls == [] and len(bad.errors) == 3
    assert bad.content == ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>\n'
                           '<tool_call>{"name": "g", "arguments": {oops}</tool_call>')
    assert "'f': arguments must be a JSON object, got a list" in bad.errors[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_string_arguments_are_decoded_and_non_objects_are_per_call_errors(fmt):
    once, twice = json.dumps({"path": "job.yaml"}), json.dumps(json.dumps({"path": "job.yaml"}))
    key = "parameters" if fmt == "llama3" else "arguments"
    for encoded in (once, twice):
        body = json.dumps({"name": "read_file", key: json.loads(encoded)})
        text = {"hermes": f"<tool_call>{body}</tool_call>", "llama3": body, "mistral": f"[TOOL_CALLS][{body}]",
                "qwen3_coder": f"<tool_call>{body}</tool_call>"}[fmt]
        assert named(parse(fmt, text).calls) == [("read_file", {"path": "job.yaml"})], text
    for args, why in (([1, 2], "got a list"), ("plain words", "not JSON"), (json.dumps(json.dumps(7)), "got a number"),
                      (None, "got null")):
        body = json.dumps({"name": "read_file", key: args})
        text = {"hermes": f"<tool_call>{body}</tool_call>", "llama3": body, "mistral": f"[TOOL_CALLS][{body}]",
                "qwen3_coder": f"<tool_call>{body}</tool_call>"}[fmt]
        p = parse(fmt, "thinking\n" + text)
        assert p.calls == [] and p.content == "thinking\n" + text
        assert len(p.errors) == 1 and "'read_file'" in p.errors[0] and why in p.errors[0], p.errors


# --- render -> parse --------------------------------------------------------------------------

ROUND_TRIP_CALLS = [
    [{"name": "read_file", "arguments": {"path": "GUIDE.md"}}],
    [{"name": "write_file", "arguments": {"path": "job.yaml", "content": "base_model: tiny-s\nseed: 0\n  indented"}},
     {"name": "validate_job", "arguments": {}}],
    [{"name": "submit_job", "arguments": {"peft": {"r": 16, "alpha": 32}, "tags": ["ü", "日本", "🙂"], "steps": 75,
                                          "lr": 0.0005, "dry": False}}],
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("calls", ROUND_TRIP_CALLS, ids=["one", "two", "typed"])
def test_render_then_parse_gives_the_calls_back(fmt, calls):
    text = TOOL_CALL_FORMATS[fmt].render(calls)
    p = parse(fmt, "Plan first.\n" + text)
    assert named(p.calls) == named(calls) and p.content == "Plan first." and not p.errors, text


def test_hermes_render_matches_the_tiny_agents_chat_template():
    from jinja2 import Environment

    calls = ROUND_TRIP_CALLS[1]
    env = Environment()
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)  # transformers' tojson
    tool_calls = to_openai_tool_calls([dict(c, id=f"c{i}") for i, c in enumerate(calls)])
    turn = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    out = env.from_string(CHAT_TEMPLATE).render(messages=[turn])
    assert out == "<|im_start|>assistant\n" + TOOL_CALL_FORMATS["hermes"].render(calls) + "<|im_end|>\n"


# --- choosing a format ------------------------------------------------------------------------

TEMPLATES = {
    "hermes": [CHAT_TEMPLATE,
               "{{- '<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>' }}"],
    "qwen3_coder": ["{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>\\n' }}"],
    "mistral": ["{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}{%- for tc in message.tool_calls %}",
                {"default": "[INST]", "tool_use": "{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}"}],
    "llama3": ["{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{{- '<|python_tag|>' + name }}",
               "{{- '<|start_header_id|>' }}{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}"],
}


@pytest.mark.parametrize("fmt,template", [(f, t) for f, ts in TEMPLATES.items() for t in ts])
def test_detect_format_from_chat_template_snippets(fmt, template):
    assert detect_format(template) == fmt


def test_detect_format_defaults_and_config_names():
    for plain in (None, "", "{{ '<|im_start|>' + message.role }}", {"default": "{{ bos_token }}"}, 42):
        assert detect_format(plain) == "hermes"
    assert resolve_format("auto", TEMPLATES["mistral"][0]).name == "mistral"
    assert resolve_format("llama3", CHAT_TEMPLATE).name == "llama3"  # a named format wins over the template
    with pytest.raises(UnknownName, match="unknown tool-call format 'chatml'; known: hermes, llama3, mistral, "
                                          "qwen3_coder; set agent.tool_format"):
        resolve_format("chatml")


def test_a_backend_reads_calls_in_its_tokenizers_format():
    class Backend(AgentBackend):
        def generate(self, messages, tools=None, **kw):
            raise NotImplementedError

    backend = Backend()
    backend.tokenizer = SimpleNamespace(chat_template=TEMPLATES["qwen3_coder"][0])
    xml = "<tool_call>\n<function=finish>\n<parameter=summary>\nok\n</parameter>\n</function>\n</tool_call>"
    assert named(backend.parse_tool_text(xml).calls) == [("finish", {"summary": "ok"})]  # auto, per call
    backend.set_tool_format("auto")
    assert backend.tool_format == "qwen3_coder"
    backend.set_tool_format("hermes")
    assert backend.parse_tool_text(xml).calls == []


def test_make_backend_takes_tool_format():
    backend = make_backend({"kind": "openai", "model": "m", "api_key_env": None, "tool_format": "mistral"})
    assert backend.tool_format == "mistral"
    assert make_backend({"kind": "openai", "model": "m", "api_key_env": None}).tool_format == "hermes"  # no template
    with pytest.raises(UnknownName, match="known: hermes, llama3"):
        make_backend({"kind": "openai", "model": "m", "api_key_env": None, "tool_format": "qwen"})


def test_openai_backend_native_calls_and_text_fallback():
    backend = make_backend({"kind": "openai", "model": "m", "api_key_env": None, "tool_format": "llama3"})

    def response(content, tool_calls=None):
        msg = SimpleNamespace(content=content, tool_calls=tool_calls)
        choice = SimpleNamespace(message=msg, finish_reason="stop", logprobs=None, model_extra={})
        return SimpleNamespace(choices=[choice], usage=SimpleNamespace(prompt_tokens=3, completion_tokens=4),
                               model_dump=lambda: {})

    twice = json.dumps(json.dumps({"summary": "ok"}))
    native = [SimpleNamespace(id="c1", function=SimpleNamespace(name="finish", arguments=twice))]
    gen = backend._to_generation(response(None, native))
    assert named(gen.tool_calls) == [("finish", {"summary": "ok"})] and gen.tool_calls[0]["id"] == "c1"
    gen = backend._to_generation(response('<|python_tag|>{"name": "finish", "parameters": {"summary": "ok"}}'))
    assert named(gen.tool_calls) == [("finish", {"summary": "ok"})] and gen.text == ""


# --- garbage in: never an exception, always the documented shapes -------------------------------

NOISE = ["<tool_call>", "</tool_call>", "<|python_tag|>", "<|eom_id|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
         "<function=", "</function>", "<parameter=", "</parameter>", "{", "}", "[", "]", '"', "\\", ":", ",", ";",
         "\n", " ", "name", "arguments", "parameters", "null", "1e999", "9" * 30, "\ud800", "\udfff", "\x00",
         "🙂", "日本", "\u202e", "\ufeff", "NaN", "true", "-", "\\ud800", '"\\"']
NOISE += [chr(i) for i in range(0, 128, 7)]


def _valid_text(rng: random.Random, fmt: str) -> str:
    names = ["read_file", "write_file", "finish", "", "ü", "a b", "x" * 40]
    values = ["job.yaml", 3, -1.5, True, None, [1, "a"], {"k": {"n": [None]}}, "", "line\nline", "\ud800", "日本🙂"]
    calls = [{"name": rng.choice(names), "arguments": {rng.choice(["path", "k", "", "é"]): rng.choice(values)
                                                       for _ in range(rng.randint(0, 3))}}
             for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.2:  # arguments as a JSON string, or not an object at all
        calls[0]["arguments"] = rng.choice([json.dumps(calls[0]["arguments"]), [1], "x", 7, None])
    if fmt == "hermes" and rng.random() < 0.3:
        return f"<tool_call>{json.dumps(calls)}</tool_call>"
    if fmt == "llama3" and rng.random() < 0.3:
        return "<|python_tag|>" + "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]})
                                            for c in calls)
    if fmt == "mistral" and rng.random() < 0.3:
        return "".join(f"[TOOL_CALLS]{c['name']}[ARGS]{json.dumps(c['arguments'])}" for c in calls)
    try:
        return TOOL_CALL_FORMATS[fmt].render(calls)
    except (AttributeError, TypeError):  # render takes well-formed calls; garbage arguments are written by hand
        return "<tool_call>" + json.dumps(calls[0]) + "</tool_call>"


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(0, 4)):
        op, i = rng.randrange(6), rng.randint(0, len(text))
        if op == 0:
            text = text[:i]  # truncated, as when generation hits max_new_tokens
        elif op == 1:
            text = text[:i] + rng.choice(NOISE) + text[i:]
        elif op == 2:
            text = text[:i] + text[i + rng.randint(1, 8):]
        elif op == 3:
            text = text + rng.choice(["\n", " ", ";"]) + text  # the same calls twice
        elif op == 4:
            text = "".join(rng.choice(NOISE) for _ in range(rng.randint(1, 6))) + text
        else:
            text = text[:i] + chr(rng.randint(0, 0x10FFFF)) + text[i:]
    return text


@pytest.mark.parametrize("fmt", FORMATS)
def test_parsers_survive_600_mutated_inputs(fmt):
    rng = random.Random(f"toolcalls-{fmt}")
    parsed_some = 0
    for n in range(600):
        text = _mutate(rng, _valid_text(rng, fmt))
        if n % 10 == 0:
            text = _valid_text(rng, rng.choice(FORMATS)) + text  # another model's format mixed in
        p = parse(fmt, text)
        check_shape(p, text)
        parsed_some += bool(p.calls)
    assert parsed_some > 100  # the mutations leave many calls whole: the parser is exercised, not only refusing


def test_openai_parser_survives_600_generated_lists():
    rng = random.Random("toolcalls-openai")
    junk = [None, 0, "", "x", [], {}, "[1]", "{", "\ud800", '"{\\"a\\": 1}"', {"a": 1}, 1e308, True]
    for _ in range(600):
        calls = []
        for _ in range(rng.randint(0, 4)):
            fn = {"name": rng.choice(["read_file", "", None, 3, "🙂", "\ud800"]),
                  "arguments": rng.choice([json.dumps({"path": "a"}), json.dumps(json.dumps({"p": 1}))] + junk)}
            if rng.random() < 0.1:
                fn = rng.choice(junk)
            tc = {"id": rng.choice(["c1", None, ""]), "type": "function", "function": fn}
            calls.append(SimpleNamespace(**tc) if rng.random() < 0.5 else rng.choice([tc, tc, "junk", None]))
        content = rng.choice([None, "", "text", "\ud800"])
        p = parse_openai_tool_calls(calls, content)
        check_shape(p, id_prefix="")
        assert len(p.calls) + len(p.errors) <= len(calls)


@pytest.mark.parametrize("fmt", FORMATS)
def test_pathological_text_is_quick_and_no_call(fmt):
    t0 = time.process_time()      # CPU time: the bound holds however loaded the machine is
    for text in ("<tool_call>" + "[" * 200_000, "[\n" * 50_000, "[TOOL_CALLS]" * 20_000 + "[",
                 '{"name": "a", "parameters": "' + "[" * 100_000 + '"}', "<tool_call><function=" * 20_000):
        p = parse(fmt, text)
        check_shape(p, text)
        assert p.calls == []
    assert time.process_time() - t0 < 5.0
