"""The agent's prompt from the model's own chat template: tools passed as schemas where the template takes them,
the project's tool prompt where it drops them (agent_trainer.outer_loop.agents.chat_prompt), said once."""

from __future__ import annotations

import copy
import json
import logging

import pytest

from agent_trainer.outer_loop.agents.chat_prompt import TemplateSupport, adapt_messages, render_prompt, template_support
from agent_trainer.outer_loop.agents.toolcalls import TOOL_CALL_FORMATS
from agent_trainer.outer_loop.episode.episode import opening_messages
from agent_trainer.outer_loop.episode.tools import SCHEMAS

# A tiny template that takes tools (as Qwen's and the tiny agent's do) and one that drops them and the
# assistant's tool_calls (SmolLM2-Instruct's, verbatim).
TAKES_TOOLS = (
    "{%- if tools %}TOOLS:{% for t in tools %}{{ t | tojson }};{% endfor %}\n{%- endif %}"
    "{%- for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ c.function.arguments }}]{%- endfor %}"
    "</{{ m.role }}>\n{%- endfor %}{%- if add_generation_prompt %}<assistant>{%- endif %}"
)
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "GUIDE.md"}'}}


@pytest.fixture(scope="module")
def project_tokenizer():
    from agent_trainer.inner_loop.models import build_tokenizer

    return build_tokenizer()


def _with_template(tokenizer, template: str):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


def _conversation() -> list[dict]:
    from agent_trainer.evaluation.tasks import load_task

    task = load_task("examples/tasks/calc_chain_v1_tiny.json")
    return opening_messages(task, "full") + [{"role": "assistant", "content": "", "tool_calls": [CALL]},
                                             {"role": "tool", "tool_call_id": "call_1", "name": "read_file",
                                              "content": "the guide"}]


def test_a_template_that_takes_tools_gets_the_schemas_and_an_unchanged_call(project_tokenizer):
    tok = _with_template(project_tokenizer, TAKES_TOOLS)
    support = template_support(tok)
    assert support == TemplateSupport(tools=True, tool_calls=True, tool_results=True) and support.complete
    messages = _conversation()
    warned = []
    text = render_prompt(tok, messages, SCHEMAS, support=support, warn=warned.append)
    assert text == tok.apply_chat_template(messages, tools=SCHEMAS, add_generation_prompt=True, tokenize=False)
    assert all(json.dumps(s) in text for s in SCHEMAS) and "# Tools" not in text and not warned
    assert adapt_messages(messages, SCHEMAS, support, TOOL_CALL_FORMATS["hermes"]) == (messages, SCHEMAS)


def test_the_tiny_agents_prompts_are_the_templates_own(project_tokenizer):
    """The project template takes everything: prompts stay byte-identical to a plain apply_chat_template."""
    support = template_support(project_tokenizer)
    assert support.complete
    for tools in (None, SCHEMAS):
        want = project_tokenizer.apply_chat_template(_conversation(), tools=tools, add_generation_prompt=True,
                                                     tokenize=False)
        assert render_prompt(project_tokenizer, _conversation(), tools, support=support) == want


def test_a_template_that_drops_tools_gets_the_projects_tool_prompt(project_tokenizer):
    tok = _with_template(project_tokenizer, SMOLLM2)
    support = template_support(tok)
    assert support == TemplateSupport(tools=False, tool_calls=False, tool_results=True)
    plain = tok.apply_chat_template(_conversation(), tools=SCHEMAS, add_generation_prompt=True, tokenize=False)
    assert "read_file" not in plain.split("<|im_start|>user")[0]   # what the template alone would give: no tools
    warned = []
    text = render_prompt(tok, _conversation(), SCHEMAS, support=support, tool_format="hermes", warn=warned.append)
    system = text.split("<|im_start|>user")[0]
    assert "# Tools" in system and all(json.dumps(s) in system for s in SCHEMAS)
    assert "<tool_call></tool_call> tags" in system
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "GUIDE.md"}}\n' \
           '</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\nthe guide<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert len(warned) == 1 and "drops tools" in warned[0]


def test_the_fallback_writes_calls_in_the_backends_format(project_tokenizer):
    tok = _with_template(project_tokenizer, SMOLLM2)
    text = render_prompt(tok, _conversation(), SCHEMAS, support=template_support(tok), tool_format="llama3")
    assert '{"name": "read_file", "parameters": {"path": "GUIDE.md"}}' in text
    assert "Write each call like this example:" in text


def test_the_real_smollm2_template_drops_tools_and_gets_the_fallback(smollm2):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2, local_files_only=True)
    support = template_support(tok)
    assert not support.tools and not support.tool_calls
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tok.apply_chat_template(base, tools=SCHEMAS, tokenize=False) == tok.apply_chat_template(base, tokenize=False)
    text = render_prompt(tok, _conversation(), SCHEMAS, support=support)
    assert all(f'"name": "{s["function"]["name"]}"' in text for s in SCHEMAS)
    assert '<tool_call>\n{"name": "read_file"' in text


def test_the_local_backend_says_it_once(project_tokenizer, caplog):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agent_trainer.outer_loop.agents.local import LocalBackend

    tok = _with_template(project_tokenizer, SMOLLM2)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True))
    backend = LocalBackend(model, tok, device="cpu")
    events = []
    backend.event_log = events.append
    with caplog.at_level(logging.WARNING, logger="agent_trainer.outer_loop.agents.local"):
        for _ in range(2):
            gen = backend.generate(_conversation(), SCHEMAS, temperature=1.0, max_new_tokens=4, seed=0)
            assert gen.prompt_ids == backend.render(_conversation(), SCHEMAS)
    assert sum("drops tools" in r.getMessage() for r in caplog.records) == 1
    assert [e["kind"] for e in events] == ["template_drops_tools"]

