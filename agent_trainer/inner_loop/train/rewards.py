"""Rewards library: TRL reward callables for GRPO jobs, and loading of a job's own ``reward.py``.

    [(name, info.description) for name, info in LIBRARY.items()]   # what the agent reads
    funcs = resolve_rewards(job_spec, job_dir)   # [(name, callable, weight)] for GRPOTrainer

Every reward is ``f(prompts, completions, **kwargs) -> list[float | None]`` and every value passes
``checked``. Not a sandbox: the job's process installs the reward host's loader
(``set_file_function_loader``). See docs/inner_loop.md ("Rewards") and docs/security.md.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import numbers
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent_trainer.registry import Registry
from agent_trainer.evaluation.families import FAMILIES, extract_answer, get_family, normalize
from agent_trainer.evaluation.families.base import label_match as _label_score

RewardFn = Callable[..., list]
# The largest reward value a function may return (library rewards lie in [-1, 1]).
MAX_ABS_REWARD = 1e4
_NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?")


class RewardError(ValueError):
    """A reward that cannot be loaded or returned bad values; the message says what to fix."""


def _column(values: Any, n: int) -> list:
    """A kwargs column as a list of length ``n`` (None everywhere when the column is missing)."""
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise RewardError(f"a reward column has {len(values)} values for {n} completions")
    return values


def _leading_number(text: str | None) -> float | None:
    """The number at the start of the answer part of ``text`` (e.g. '16 apples' -> 16.0), or None."""
    if text is None:
        return None
    match = _NUMBER.match(extract_answer(str(text)))
    return float(match.group()) if match else None


def _units(text: str) -> list[str]:
    """Units compared by ``token_overlap``: words when the text has spaces, else characters."""
    text = normalize(text)
    return text.split(" ") if " " in text else list(text)


# --- the library ------------------------------------------------------------------------------


def exact_match(prompts, completions, answer=None, **kwargs) -> list[float | None]:
    """1.0 when the first line of the completion equals the answer (normalised), else 0.0."""
    answers = _column(answer, len(completions))
    return [None if a is None else float(normalize(extract_answer(c)) == normalize(str(a)))
            for c, a in zip(completions, answers)]


def numeric_closeness(prompts, completions, answer=None, **kwargs) -> list[float | None]:
    """Partial credit for numbers: ``1 / (1 + |got - want| / s)`` with ``s = max(1, |want| / 10)``.

    1.0 for the exact number, 0.5 when one unit off for answers up to 10; the scale ``s`` keeps
    large answers (3000 m) from collapsing to 0 for a near miss. 0.0 when the completion does not
    start with a number; None when the answer is not a number (the reward does not apply).
    """
    answers = _column(answer, len(completions))
    out: list[float | None] = []
    for c, a in zip(completions, answers):
        want = _leading_number(a)
        if want is None:
            out.append(None)
            continue
        got = _leading_number(c)
        out.append(0.0 if got is None else 1.0 / (1.0 + abs(got - want) / max(1.0, abs(want) / 10.0)))
    return out


def _shape_ok(line: str, answer: str | None) -> bool:
    if answer is None:
        return True
    answer = answer.strip()
    if re.fullmatch(r"[+-]?\d+", answer):
        return re.fullmatch(r"[+-]?\d+", line) is not None
    if re.fullmatch(r"[+-]?\d+( [+-]?\d+)+", answer):
        return re.fullmatch(r"[+-]?\d+( [+-]?\d+)*", line) is not None
    if re.fullmatch(r"[A-Za-z]+", answer):
        return re.fullmatch(r"[A-Za-z]+", line) is not None
    return len(line) <= 2 * len(answer) + 8


def format_ok(prompts, completions, answer=None, **kwargs) -> list[float | None]:
    """1.0 when the completion is one non-empty line shaped like the answer (a number, numbers, a word)."""
    answers = _column(answer, len(completions))
    out: list[float | None] = []
    for c, a in zip(completions, answers):
        text = c.strip()
        ok = bool(text) and "\n" not in text and _shape_ok(text, None if a is None else str(a))
        out.append(float(ok))
    return out


def length_penalty(prompts, completions, answer=None, **kwargs) -> list[float | None]:
    """0.0 up to len(answer) + 1 characters (16 without an answer), then -1/16 per extra character, down to -1.0."""
    answers = _column(answer, len(completions))
    out: list[float | None] = []
    for c, a in zip(completions, answers):
        target = len(str(a).strip()) + 1 if a is not None else 16
        out.append(-min(1.0, max(0, len(c.strip()) - target) / 16))
    return out


def label_match(prompts, completions, answer=None, **kwargs) -> list[float | None]:
    """1.0 when the first word of the completion is the answer label (case-insensitive), else 0.0."""
    answers = _column(answer, len(completions))
    return [None if a is None else _label_score(c, str(a)) for c, a in zip(completions, answers)]


def token_overlap(prompts, completions, answer=None, **kwargs) -> list[float | None]:
    """Partial credit for sequences (sort, reverse): mean of in-position match and multiset F1.

    Units are words when the answer has spaces ('2 5 9'), else characters ('tac'). 'tca' for
    'tac' gets (1/3 + 1) / 2; the right numbers in the wrong order get at least 0.5.
    """
    answers = _column(answer, len(completions))
    out: list[float | None] = []
    for c, a in zip(completions, answers):
        if a is None:
            out.append(None)
            continue
        want, got = _units(str(a)), _units(extract_answer(c))
        got = [u for u in got if u]
        if not want or not got:
            out.append(float(want == got))
            continue
        positional = sum(g == w for g, w in zip(got, want)) / max(len(got), len(want))
        common = sum(min(got.count(u), want.count(u)) for u in set(want))
        f1 = 2 * common / (len(got) + len(want))
        out.append((positional + f1) / 2)
    return out


def task_score(prompts, completions, answer=None, family=None, **kwargs) -> list[float | None]:
    """The hidden evaluation's own scorer of the row's family (None for rows without a known family)."""
    answers = _column(answer, len(completions))
    families = _column(family, len(completions))
    out: list[float | None] = []
    for c, a, f in zip(completions, answers, families):
        out.append(None if a is None or f not in FAMILIES else get_family(f).score_one(c, str(a)))
    return out


@dataclass(frozen=True)
class RewardInfo:
    """A library reward and the one line an agent reads about it."""

    fn: RewardFn
    description: str


_BUILT_IN: dict[str, RewardInfo] = {
    "exact_match": RewardInfo(
        exact_match, "1 if the first line equals the answer, else 0; sparse when the base is weak"),
    "numeric_closeness": RewardInfo(
        numeric_closeness, "partial credit 1/(1+|got-want|/s) for numeric answers; pair it with exact_match"),
    "format_ok": RewardInfo(format_ok, "1 if the completion is one line shaped like the answer (number/word/list)"),
    "length_penalty": RewardInfo(length_penalty, "0 for answer-length completions, -1/16 per extra character, min -1"),
    "label_match": RewardInfo(label_match, "1 if the first word is the answer label (classification tasks)"),
    "token_overlap": RewardInfo(token_overlap, "partial credit for sequences: in-position matches and shared items"),
    "task_score": RewardInfo(task_score, "the hidden evaluation's scorer for the row's family (0 or 1)"),
}
LIBRARY: Registry[RewardInfo] = Registry("library reward", error=RewardError,
                                          hint="or set source: file for a function in reward.py")
for _name, _info in _BUILT_IN.items():
    LIBRARY.register(_name, _info)


def describe_library() -> list[dict[str, str]]:
    """Name and description of every library reward, for the agent's prompt and tools."""
    return [{"name": name, "description": info.description} for name, info in LIBRARY.items()]


# --- resolving a job's rewards ----------------------------------------------------------------


def plain_reward(value: Any) -> float | None:
    """``value`` as a plain float (None stays None); ``RewardError`` for anything else.

    Only ``int``/``float`` themselves and other real numbers whose ``float()`` is a plain float pass,
    then the *converted* value must be finite and within ``MAX_ABS_REWARD``: a float subclass can
    report one value to ``math.isfinite`` and another (1e308) to ``float()``, and a huge finite
    reward summed over functions becomes inf, which zeroes GRPO's advantages for the rest of a run."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardError(f"returned {value!r:.60}; each value must be a finite float or None")
    x = float(value)
    if type(x) is not float or not math.isfinite(x) or abs(x) > MAX_ABS_REWARD:
        raise RewardError(f"returned {x!r:.60}; each value must be a finite float or None, "
                          f"between -{MAX_ABS_REWARD:g} and {MAX_ABS_REWARD:g}")
    return x


def checked(name: str, fn: RewardFn) -> RewardFn:
    """Wrap ``fn`` so that a wrong-length or non-numeric result fails with the reward's name (``plain_reward``)."""

    @functools.wraps(fn)
    def wrapper(prompts, completions, **kwargs):
        values = fn(prompts=prompts, completions=completions, **kwargs)
        if not isinstance(values, (list, tuple)):
            raise RewardError(f"reward {name!r} returned {type(values).__name__}; return a list of floats (or None)")
        if len(values) != len(completions):
            raise RewardError(f"reward {name!r} returned {len(values)} values for {len(completions)} completions; "
                              "return one value per completion")
        try:
            return [plain_reward(v) for v in values]
        except RewardError as e:
            raise RewardError(f"reward {name!r} {e}") from None

    wrapper.__name__ = name  # TRL logs rewards/<__name__>
    return wrapper


def load_reward_file(path: str | Path) -> types.ModuleType:
    """Import a job's reward file as a fresh module (runs agent code: job process only)."""
    path = Path(path)
    if not path.is_file():
        raise RewardError(f"reward file {path.name!r} not found in the job folder; write it or use library rewards")
    spec = importlib.util.spec_from_file_location(f"job_reward_{abs(hash(str(path.resolve())))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise RewardError(f"reward file {path.name} line {e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # agent code: any failure at import time is the agent's to fix
        raise RewardError(f"reward file {path.name} failed on import: {type(e).__name__}: {e}") from None
    return module


# A job process whose agent reward code runs in a sandboxed reward host
# (``agent_trainer.inner_loop.isolation.reward_proxy``) installs a loader here: ``resolve_rewards`` then gets
# ``source: file`` functions from it, as callables that ask the host, and never imports the agent's file in this
# process.
_file_function_loader: Callable[[Path, str], RewardFn] | None = None


def set_file_function_loader(loader: Callable[[Path, str], RewardFn] | None) -> None:
    """Route ``source: file`` rewards of this process to ``loader(path, name)`` (None: import them here)."""
    global _file_function_loader
    _file_function_loader = loader


def resolve_rewards(spec, job_dir: str | Path) -> list[tuple[str, RewardFn, float]]:
    """``(name, callable, weight)`` per reward of a JobSpec (or RewardSpec); imports ``reward.py`` if used."""
    reward = getattr(spec, "reward", spec)
    if reward is None:
        raise RewardError("the job has no reward section; GRPO needs reward: {functions: [{name: exact_match}]}")
    module = None
    out: list[tuple[str, RewardFn, float]] = []
    for f in reward.functions:
        if f.source == "library":
            fn = LIBRARY[f.name].fn
        elif _file_function_loader is not None:
            fn = _file_function_loader(Path(job_dir) / reward.file, f.name)
        else:
            module = module or load_reward_file(Path(job_dir) / reward.file)
            fn = getattr(module, f.name, None)
            if not callable(fn):
                raise RewardError(f"reward file {reward.file} defines no function {f.name!r}; "
                                  f"define def {f.name}(prompts, completions, **kwargs) -> list[float]")
        out.append((f.name, checked(f.name, fn), float(f.weight)))
    return out
