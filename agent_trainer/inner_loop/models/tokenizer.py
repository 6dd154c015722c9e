"""The project's own BPE tokenizer, shared by the tiny inner models and the tiny agent model.

    >>> from agent_trainer.inner_loop.models.tokenizer import build_tokenizer
    >>> tok = build_tokenizer()                # deterministic: same corpus, same merges, same ids
    >>> tok.save_pretrained("some/folder")     # then AutoTokenizer.from_pretrained("some/folder")

Text format: ``prompt`` as the family writes it, then ``answer`` and ``eos_token`` (``<|im_end|>``), no
separator; the tokens of ``prompt`` are always a prefix of those of ``prompt + answer``. Special tokens
and the chat template follow Qwen3.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [
    PAD_TOKEN, "<|im_start|>", EOS_TOKEN,
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
VOCAB_SIZE = 1536

# Qwen3's template, cut down: system prompt with a tool list, user/assistant/tool turns, assistant
# tool calls as <tool_call>{json}</tool_call>, consecutive tool results grouped in one user turn,
# and the enable_thinking=False switch that writes an empty think block.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures are within <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return a json object with the function name and arguments within "
    "<tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Text an agent will write later (job files, tool calls, explanations): the same tokenizer serves
# the tiny agent model, so these words should not shatter into single bytes.
_AGENT_TEXT = [
    "base_model: tiny-s\nalgorithm: grpo\npeft: {r: 16, alpha: 32}\n"
    "hyperparameters: {learning_rate: 5.0e-4, batch_size: 64, num_generations: 8, max_steps: 75}\n"
    "data:\n  sources: [{family: calc_chain, seed: 1, size: 2000}]\n"
    "reward:\n  functions: [{name: numeric_closeness, weight: 1.0}, {name: exact_match, weight: 1.0}]\nseed: 0\n",
    "base_model: tiny-m\nalgorithm: sft\npeft: null\nhyperparameters:\n  learning_rate: 1.0e-3\n  batch_size: 64\n"
    "  max_steps: 150\n  lr_scheduler: cosine\n  warmup_ratio: 0.1\n  weight_decay: 0.0\n  max_grad_norm: 1.0\n"
    "data:\n  file: data.jsonl\nseed: 3\n",
    "hyperparameters: {temperature: 1.0, beta: 0.0, loss_type: dapo, scale_rewards: group, "
    "max_completion_length: 12, epochs: 2}\npeft: {r: 8, alpha: 16, dropout: 0.05, target_modules: all-linear}\n",
    "reward: {file: reward.py, functions: [{name: my_reward, weight: 0.5, source: file}]}\n",
    '{"name": "write_file", "arguments": {"path": "job.yaml", "content": "base_model: tiny-s\\nalgorithm: sft\\n"}}',
    '{"name": "read_file", "arguments": {"path": "data.jsonl"}}',
    '{"name": "validate_job", "arguments": {}}', '{"name": "submit_job", "arguments": {}}',
    '{"name": "lookup_baseline", "arguments": {"base_model": "tiny-m", "family": "sort_numbers"}}',
    '{"name": "journal", "arguments": {"entry": "switch strategy: sft with lora on curated data"}}',
    '{"prompt": "calc: 12+7-3=", "answer": "16"}\n{"prompt": "reverse: cat =", "answer": "tac"}\n',
    "def reward(prompts, completions, **kwargs):\n    return [1.0 if c.strip() == a else 0.0 "
    "for c, a in zip(completions, kwargs['answer'])]\n",
    "The job is valid. Training finished with status ok: hidden score 0.31, baseline 0.12, uplift 0.19. "
    "The validation failed: hyperparameters.batch_size must be divisible by num_generations. "
    "I will use GRPO with a LoRA adapter, a learning rate of 5e-4 and 8 generations per prompt. "
    "Supervised fine-tuning (SFT) on curated data is strong for this family; the larger base model "
    "has the edge. The reward should give partial credit for numeric closeness. Let me write the job, "
    "validate it and submit it. The task asks to train the model to sort numbers, reverse words, "
    "convert units, count letters, evaluate arithmetic and route support messages to a queue.",
    "status: crashed timeout diverged over_budget invalid error warning tokens seconds steps loss accuracy",
]


# Their prompts are random letter strings: merging their letter pairs would fill the vocabulary with
# junk and hide the letters from the model (counting "xqz" is learnable, counting one token is not).
_RANDOM_LETTER_FAMILIES = ("count_char", "reverse_text")


def tokenizer_corpus(per_family: int = 400) -> list[str]:
    """The deterministic training corpus: family items and instructions plus agent-style text."""
    from agent_trainer.evaluation.families import FAMILIES, get_family

    texts: list[str] = []
    for name in sorted(FAMILIES):
        fam = get_family(name)
        texts.append(fam.instruction)
        texts.append(fam.notes)
        # Items of the stream the shipped models were built from (``TaskFamily.pretraining_stream``), so this
        # corpus, and the tokenizer, stay those of the shipped files.
        stream = fam.pretraining_stream(seed=0)
        texts.append(json.dumps({**fam.describe(), "example": next(stream).as_dict()}))
        if name in _RANDOM_LETTER_FAMILIES:
            continue
        stream = fam.pretraining_stream(seed=0)
        texts.extend(ex.prompt + ex.answer for ex in (next(stream) for _ in range(per_family)))
    # Repeat the agent text so its words win merges over one-off family strings.
    texts.extend(_AGENT_TEXT * 20)
    return texts


def build_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on ``tokenizer_corpus()`` (deterministic, < 1 s)."""
    tok = Tokenizer(models.BPE())
    # Punctuation first: otherwise "=-" merges into one token and prompts stop being token prefixes.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Punctuation("isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=3,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
        padding_side="left",
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
