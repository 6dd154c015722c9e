"""Which exceptions of the project's packages are user mistakes (one line, no traceback)."""

from __future__ import annotations

import importlib

# (module, class): raised for things a user can fix (bad spec, unknown family, missing weights).
USER_ERROR_CLASSES = (
    ("evaluation.tasks", "TaskSpecError"),
    ("evaluation.families", "FamilyError"),
    ("evaluation.hidden_eval", "EvalError"),
    ("inner_loop.models", "ModelNotFoundError"),
    ("inner_loop.models", "ModelError"),
    ("inner_loop.job", "JobError"),
)


def user_errors() -> tuple[type[BaseException], ...]:
    """The classes above that exist in this checkout (packages still being written are skipped)."""
    found = []
    for module, name in USER_ERROR_CLASSES:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)
