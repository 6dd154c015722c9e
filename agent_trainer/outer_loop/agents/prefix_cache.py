"""Keys and values of token sequences the local backend has already run, reused as the cached prefix of new prompts.

An episode's next prompt is its last prompt, the sampled turn and the tool result: all but the new tokens were
computed in the turn before. Every episode of a step also opens with the same system prompt and tool list. The
local backend keeps each finished row's keys and values here and starts a prompt from the longest stored prefix,
so a turn's prefill runs over its new tokens only (``LocalBackend._sample_batch``).

Only for models whose every layer attends to the whole sequence (no sliding window): a stored key was computed at
its absolute position and stays valid there. For those models the batch's own cache is a ``growing_cache``: a decode
step writes its one new position into spare room instead of copying every layer's keys and values (``torch.cat``,
what transformers' ``DynamicCache`` does: at 8 rows and 1,500 positions that copy is a sizeable part of a step).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class Prefix:
    """One stored sequence: its tokens and each layer's ``(keys, values)``, ``[kv_heads, len(tokens), head_dim]``."""

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]


def common_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def growing_cache(kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None, filled: int | None = None):
    """A transformers ``DynamicCache`` whose layers append into preallocated room (``growing_layer``), holding
    ``kv`` (each layer's ``(keys, values)``, ``[batch, kv_heads, positions, head_dim]``) when given: copied into new
    buffers, or, with ``filled``, taken as the buffers themselves, their first ``filled`` positions the contents."""
    from transformers.cache_utils import Cache, DynamicCache

    cache = DynamicCache()
    Cache.__init__(cache, layer_class_to_replicate=growing_layer())
    for i, (k, v) in enumerate(kv or ()):
        if filled is None:
            cache.update(k, v, i)
        else:
            cache.layers.append(growing_layer().holding(k, v, filled))
    return cache


@functools.cache
def growing_layer() -> type:
    """The layer class of ``growing_cache`` (made on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are views of a buffer with ``SPARE`` positions to spare: an
        update writes the new positions in place; the buffer is reallocated (copied) only when it is full."""

        SPARE = 256

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._k = self._v = None

        @classmethod
        def holding(cls, keys: torch.Tensor, values: torch.Tensor, n: int) -> "GrowingLayer":
            """A layer whose buffers are ``keys`` and ``values`` (not copied), the first ``n`` positions filled."""
            layer = cls()
            layer.lazy_initialization(keys, values)
            layer._k, layer._v = keys, values
            layer.keys, layer.values = keys[:, :, :n], values[:, :, :n]
            return layer

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = self.get_seq_length()
            m = n + key_states.shape[-2]
            if self._k is None or m > self._k.shape[-2]:
                k = key_states.new_empty((*key_states.shape[:2], m + self.SPARE, key_states.shape[-1]))
                v = value_states.new_empty((*value_states.shape[:2], m + self.SPARE, value_states.shape[-1]))
                if n:
                    k[:, :, :n] = self.keys
                    v[:, :, :n] = self.values
                self._k, self._v = k, v
            self._k[:, :, n:m] = key_states
            self._v[:, :, n:m] = value_states
            self.keys, self.values = self._k[:, :, :m], self._v[:, :, :m]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            n = self.get_seq_length()
            if n > 0:
                self._k, self._v = self._k[indices], self._v[indices]
                self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

    return GrowingLayer


def supports_prefix_cache(config) -> bool:
    """Whether every layer of the model attends to the whole sequence (stored keys stay valid at their position)."""
    types = getattr(config, "layer_types", None)
    if types:
        return all(t == "full_attention" for t in types)
    return not getattr(config, "use_sliding_window", False) and not getattr(config, "sliding_window_pattern", None)


class PrefixCache:
    """Stored sequences, oldest first, at most ``max_tokens`` tokens in all; an entry that is a prefix of a newer
    one is dropped (the newer one serves every prompt the older one would)."""

    def __init__(self, max_tokens: int):
        self.max_tokens = int(max_tokens)
        self.entries: list[Prefix] = []

    def __len__(self) -> int:
        return len(self.entries)

    def tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def longest(self, prompt: list[int]) -> tuple[Prefix | None, int]:
        """The stored sequence sharing the longest prefix with ``prompt``, and that length (at most
        ``len(prompt) - 1``: the last prompt token is always run, its logits start the turn)."""
        best, best_n = None, 0
        for e in self.entries:
            n = min(common_length(e.tokens, prompt), len(prompt) - 1)
            if n > best_n:
                best, best_n = e, n
        return best, best_n

    def add(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store a sequence (its ``kv`` already sliced to ``len(tokens)`` positions)."""
        if not tokens or len(tokens) > self.max_tokens:
            return
        self.entries = [e for e in self.entries
                        if not (len(e.tokens) <= len(tokens) and e.tokens == tokens[: len(e.tokens)])]
        self.entries.append(Prefix(list(tokens), kv))
        while self.tokens() > self.max_tokens:
            self.entries.pop(0)

    def clear(self) -> None:
        """Forget every stored sequence (the model's weights changed: stored keys are stale)."""
        self.entries = []
