"""A KV cache that writes each step's keys and values in place, for the local backend's batched sampling.

    cache = growing_cache(spare=budget)                        # empty: layers made at the first forward
    cache = growing_cache([(keys, values), ...], spare=budget)  # from stored prefixes

transformers' ``DynamicLayer`` appends by ``torch.cat``: every decode step copies the whole cache of every
layer (batch 8 at 3,000 positions: ~1 GB a step for SmolLM2-135M, twice the weights it reads). A
``GrowingLayer`` holds ``spare`` positions of room behind its contents and writes new positions there, so a
step copies only what it adds; when the room runs out it doubles. ``keys``/``values`` are views of the
filled part, so everything that reads a ``DynamicLayer`` (attention, masks, ``batch_select_indices``,
iterating the cache) reads a ``GrowingLayer`` the same way. ``bench/kv_cache.py`` measures the two.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` with room for ``spare`` more positions, filled in place."""

    def __init__(self, spare: int = 256):
        super().__init__()
        self.spare = max(1, int(spare))
        self.length = 0

    def _allocate(self, like: torch.Tensor, capacity: int) -> torch.Tensor:
        b, h, _, d = like.shape
        return like.new_empty((b, h, capacity, d))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._k = self._allocate(key_states, self.spare)
        self._v = self._allocate(value_states, self.spare)
        self.length = 0
        self.is_initialized = True

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self._k.shape[-2]:
            capacity = max(2 * self._k.shape[-2], self.length + n + self.spare)
            k, v = self._allocate(self._k, capacity), self._allocate(self._v, capacity)
            k[:, :, :self.length] = self._k[:, :, :self.length]
            v[:, :, :self.length] = self._v[:, :, :self.length]
            self._k, self._v = k, v
        self._k[:, :, self.length:self.length + n] = key_states
        self._v[:, :, self.length:self.length + n] = value_states
        self.length += n
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of positions to remove")
        if self.is_initialized and tokens_to_remove:
            self.length = max(0, self.length + tokens_to_remove)
            self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._view()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._view()

    def reset(self) -> None:
        self.length = 0
        super().reset()


def growing_cache(layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None, *, spare: int) -> DynamicCache:
    """A ``DynamicCache`` of ``GrowingLayer``s holding ``layers``' keys and values (or empty), each with room for
    ``spare`` more positions."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = lambda: GrowingLayer(spare)
    for keys, values in layers or ():
        layer = GrowingLayer(keys.shape[-2] + spare)
        layer.update(keys, values)
        cache.layers.append(layer)
    return cache
