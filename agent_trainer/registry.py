"""One small registry for everything chosen by name: task families, rewards, base models, executors...

    >>> from agent_trainer.registry import Registry
    >>> FAMILIES = Registry("task family")
    >>> FAMILIES.register("calc_chain", CalcChain)
    >>> FAMILIES["calc"]                       # UnknownName: unknown task family 'calc'; known: calc_chain, ...

A read-only ``Mapping`` plus ``register``; ``loaders`` add entries from configuration (called before the first
lookup and again whenever their ``key()`` changes: see ``agent_trainer.evaluation.families`` and
``agent_trainer.inner_loop.models``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
# Entries from configuration: set by ``agent_trainer.cli.open_run`` from ``task.include_path`` and ``base_models``,
# copied into each job process's environment (``agent_trainer.inner_loop.run.job_env``) and sent with each request
# to a Ray or SLURM worker (``agent_trainer.inner_loop.run.launchers.run_request``).
INCLUDE_PATH_ENV = "AGENT_TRAINER_INCLUDE_PATH"
BASE_MODELS_ENV = "AGENT_TRAINER_BASE_MODELS"
REGISTRY_ENV = (INCLUDE_PATH_ENV, BASE_MODELS_ENV)


def configured_env() -> dict[str, str]:
    """The variables of ``REGISTRY_ENV`` this process has set: what a job process or a remote worker is given."""
    return {k: os.environ[k] for k in REGISTRY_ENV if os.environ.get(k)}


class UnknownName(ValueError):
    """A name no registry entry has; the message lists the known ones."""


class Registry(Mapping, Generic[T]):
    """Named entries of one kind, with one error style for unknown names."""

    def __init__(self, kind: str, error: type[Exception] = UnknownName, hint: str = ""):
        self.kind, self.error, self.hint = kind, error, hint
        self._entries: dict[str, T] = {}
        self._loaded: dict[int, object] = {}
        self._loaders: list[tuple[Callable[[], object], Callable[["Registry[T]", object], None]]] = []

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add ``entry`` as ``name``; a second entry of the same name needs ``replace=True``."""
        if not replace and name in self._entries and self._entries[name] is not entry:
            raise self.error(f"{self.kind} {name!r} is registered already; pick another name")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (no error when absent)."""
        self._entries.pop(name, None)

    def add_loader(self, key: Callable[[], object], load: Callable[["Registry[T]", object], None]) -> None:
        """Call ``load(self, key())`` before lookups whenever ``key()`` differs from its last value."""
        self._loaders.append((key, load))

    def _refresh(self) -> None:
        for i, (key, load) in enumerate(self._loaders):
            k = key()
            if self._loaded.get(i, object()) != k:
                load(self, k)  # an error here repeats at every lookup until the configuration is fixed
                self._loaded[i] = k

    def unknown(self, name: object) -> Exception:
        """The error for an unknown ``name`` (raise it)."""
        known = ", ".join(sorted(self._entries)) or "none"
        hint = f"; {self.hint}" if self.hint else ""
        return self.error(f"unknown {self.kind} {name!r}; known: {known}{hint}")

    def __getitem__(self, name: str) -> T:
        self._refresh()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self.unknown(name) from None

    def get(self, name: str, default: T | None = None) -> T | None:
        """The entry of ``name``, or ``default`` (no error)."""
        self._refresh()
        return self._entries.get(name, default)

    def __contains__(self, name: object) -> bool:
        self._refresh()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self._refresh()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._refresh()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"
