"""A model folder's tokenizer without transformers: its ``tokenizer.json`` (the same Rust ``tokenizers`` object a
fast tokenizer wraps) and its chat template rendered as transformers renders it, for the contamination check.

    tok = FolderTokenizer.load("~/.cache/agent-trainer/models/smollm2-135m-v1")
    tok(["calc: 11-3-3="], add_special_tokens=False)["input_ids"]
    evaluation.prompts.render(tok, "calc: 11-3-3=", fmt)   # the chat template, as the trainer renders it

Why: the checking child runs once per job; importing transformers (and torch through it) cost ~35 s of a loaded
2-core box, ten times the check itself. A test holds that ids, offsets and rendered prompts equal transformers'.
"""

from __future__ import annotations

import json
from pathlib import Path


class FolderTokenizer:
    """The part of a transformers fast tokenizer the token judge uses: ``len``, ``__call__`` (ids and offsets),
    ``batch_decode``, ``convert_ids_to_tokens``, ``chat_template`` and ``apply_chat_template``."""

    def __init__(self, tokenizer, config: dict, chat_template: str | None):
        self._tok = tokenizer
        self.config = config
        self.chat_template = chat_template

    @classmethod
    def load(cls, folder: str | Path) -> "FolderTokenizer":
        """The tokenizer saved in a model folder (``tokenizer.json``, ``tokenizer_config.json``, the template)."""
        from tokenizers import Tokenizer

        folder = Path(folder).expanduser()
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template = config.get("chat_template")
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), config, template)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __call__(self, text, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> dict:
        batch = not isinstance(text, str)
        encs = self._tok.encode_batch(list(text), add_special_tokens=add_special_tokens) if batch else \
            [self._tok.encode(text, add_special_tokens=add_special_tokens)]
        out = {"input_ids": [e.ids for e in encs]}
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encs]
        return out if batch else {k: v[0] for k, v in out.items()}

    def batch_decode(self, ids: list[list[int]]) -> list[str]:
        return self._tok.decode_batch(ids, skip_special_tokens=False)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self._tok.id_to_token(i) for i in ids]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tokenize: bool = False) -> str:
        """The chat template rendered as transformers renders it (its sandboxed jinja2 settings)."""
        if tokenize:
            raise ValueError("FolderTokenizer renders text only (tokenize=False)")
        special = {k: v for k, v in self.config.items() if k.endswith("_token") and isinstance(v, str)}
        return self._compiled().render(messages=messages, add_generation_prompt=add_generation_prompt, **special)

    def _compiled(self):
        """The chat template compiled once (compiling it for every row cost 20 s on 1,000 rows)."""
        if getattr(self, "_template", None) is None:
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)

            def raise_exception(message):
                raise jinja2.exceptions.TemplateError(message)

            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        return self._template
