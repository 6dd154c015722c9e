"""Which exceptions of the project's packages are user mistakes (one line, no traceback)."""

from __future__ import annotations

import sys

# (module, class): raised for things a user can fix (bad spec, unknown family, missing weights).
USER_ERROR_CLASSES = (
    ("agent_trainer.registry", "UnknownName"),
    ("agent_trainer.evaluation.tasks", "TaskSpecError"),
    ("agent_trainer.evaluation.families", "FamilyError"),
    ("agent_trainer.evaluation.hidden_eval", "EvalError"),
    ("agent_trainer.inner_loop.models", "ModelNotFoundError"),
    ("agent_trainer.inner_loop.models", "ModelError"),
    ("agent_trainer.inner_loop.run.job", "JobError"),
    ("agent_trainer.inner_loop.spec.calibrate", "CalibrationError"),
    ("agent_trainer.outer_loop.agents.served_sampler", "ServedSamplerError"),   # agent.sampler=served:
                                                                                # the server's answer
)


def user_errors() -> tuple[type[BaseException], ...]:
    """The classes above whose modules are loaded (packages still being written are skipped).

    Only loaded modules: an exception of a class can only have been raised once its module was
    imported, and importing the others here (torch, transformers) would delay a one-line error by
    seconds.
    """
    found = []
    for module, name in USER_ERROR_CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is None:
            continue
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)
