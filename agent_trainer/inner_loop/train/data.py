"""Training rows of a job: library family sources mixed by weight, plus the job's ``data.jsonl``.

    rows = build_rows(spec, job_dir, default_family="calc_chain")
    rows[0]   # {"prompt": "calc: 12+7-3=", "answer": "16", "family": "calc_chain"}

``build_rows_with_origins`` also says where each row came from (curated, self_generated, agent).
The mixing rule and the data file's format: docs/jobs.md, "The job folder".
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from agent_trainer.evaluation.families import FAMILIES, get_family
from agent_trainer.inner_loop.spec.jobfiles import MAX_COLUMNS, MAX_FIELD_CHARS, MAX_KEY_CHARS

MAX_DATA_FILE_BYTES = 20 * 1024 * 1024  # an agent-written data.jsonl (the rows are parsed in memory)
MAX_ROWS = 100_000
MAX_PROMPT_CHARS = 2000
_MAX_LISTED = 5


class DataFileError(ValueError):
    """A data file with problems; ``problems`` lists ``(line number, message)``, the message the first few."""

    def __init__(self, path: Path, problems: list[tuple[int, str]]):
        self.path, self.problems = path, problems
        shown = "; ".join(f"line {n}: {m}" if n else m for n, m in problems[:_MAX_LISTED])
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        super().__init__(f"{path.name}: {shown}{more}")


def _check_row(obj: object) -> str | None:
    """Why a parsed line is not a usable row, or None when it is."""
    if not isinstance(obj, dict):
        return f"expected a JSON object like {{\"prompt\": \"...\", \"answer\": \"...\"}}, got {type(obj).__name__}"
    for key in ("prompt", "answer"):
        if key not in obj:
            return f"missing key {key!r}; every row needs \"prompt\" and \"answer\""
        if not isinstance(obj[key], str):
            return f"{key!r} must be a string, got {type(obj[key]).__name__} (write it in quotes)"
        if not obj[key].strip():
            return f"{key!r} is empty"
        try:
            obj[key].encode("utf-8")
        except UnicodeEncodeError:
            return f"{key!r} holds an escape that is no character (a lone \\ud800-style surrogate); remove it"
    if len(obj["prompt"]) > MAX_PROMPT_CHARS:
        return f"prompt has {len(obj['prompt'])} characters; keep prompts under {MAX_PROMPT_CHARS}"
    if len(obj) > MAX_COLUMNS:
        return f"the row has {len(obj)} columns; the limit is {MAX_COLUMNS}"
    for key, value in obj.items():
        if len(key) > MAX_KEY_CHARS:
            return f"a column name has {len(key)} characters; keep names under {MAX_KEY_CHARS}"
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            return f"column {key[:40]!r} has {len(value)} characters; keep every value under {MAX_FIELD_CHARS}"
    fam = obj.get("family")
    if fam is not None and fam not in FAMILIES:
        return f"unknown family {fam!r}; known: {', '.join(sorted(FAMILIES))} (or leave family out)"
    for key, value in obj.items():
        if value is not None and not isinstance(value, (str, int, float, bool)):
            return f"column {key!r} must be a string, number, boolean or null, got {type(value).__name__}"
    return None


def read_data_file(path: str | Path) -> list[dict]:
    """Rows of a JSONL data file; raises ``DataFileError`` naming the bad lines and the fix."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(path, [(0, "file not found in the job folder; write it or remove data.file")])
    if path.stat().st_size > MAX_DATA_FILE_BYTES:
        raise DataFileError(path, [(0, f"file is over {MAX_DATA_FILE_BYTES // 2**20} MB; use fewer rows")])
    rows: list[dict] = []
    problems: list[tuple[int, str]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataFileError(path, [(0, "file is not UTF-8 text")]) from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append((n, f"not valid JSON ({e.msg} at column {e.colno})"))
            continue
        except (ValueError, RecursionError):  # a number of thousands of digits, nesting too deep
            problems.append((n, "not a usable JSON row (a huge number or nesting too deep)"))
            continue
        why = _check_row(obj)
        if why:
            problems.append((n, why))
        else:
            rows.append(obj)
    if problems:
        raise DataFileError(path, problems)
    if not rows:
        raise DataFileError(path,
                            [(0, "file has no rows; add lines like {\"prompt\": \"calc: 2+3=\", \"answer\": \"5\"}")])
    if len(rows) > MAX_ROWS:
        raise DataFileError(path, [(0, f"file has {len(rows)} rows; the limit is {MAX_ROWS}")])
    return rows


def _apportion(total: int, weights: list[float]) -> list[int]:
    """Split ``total`` into integer shares proportional to ``weights`` (largest remainder, stable)."""
    s = sum(weights)
    exact = [total * w / s for w in weights]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares


def source_items(src) -> list[dict]:
    """The items of one library source: ``{"prompt", "answer", "family"}`` from its family's generator."""
    return [dict(ex.as_dict(), family=src.family)
            for ex in get_family(src.family).training_examples(seed=src.seed, n=src.size)]


def _library(spec, seed: int | None, generated: dict | None) -> list[tuple[str, dict]]:
    """``(origin, row)`` pairs of the mixed library sources (see ``build_rows``)."""
    seed = spec.seed if seed is None else seed
    sources = spec.data.sources
    if not sources:
        return []
    quotas = _apportion(sum(s.size for s in sources), [s.weight for s in sources])
    out: list[tuple[str, dict]] = []
    for i, (src, quota) in enumerate(zip(sources, quotas)):
        selfgen = src.self_generated is not None and generated is not None
        pool = generated[i] if selfgen else source_items(src)
        if not pool or not quota:
            continue
        rng = random.Random(f"mix/{seed}/{i}")
        full, rest = divmod(quota, len(pool))
        origin = "self_generated" if selfgen else "curated"
        out.extend((origin, row) for row in pool * full + rng.sample(pool, rest))
    return out


def library_rows(spec, seed: int | None = None, generated: dict[int, list[dict]] | None = None) -> list[dict]:
    """The mixed library rows of a job (not shuffled); ``seed`` defaults to the job seed.

    ``generated`` maps a ``self_generated`` source's index to its pool of accepted samples
    (``agent_trainer.inner_loop.train.selfgen``); without it such a source stands in with its prompts and reference
    answers (what validation counts before any model has sampled).
    """
    return [row for _, row in _library(spec, seed, generated)]


def build_rows_with_origins(spec, job_dir: str | Path, default_family: str | None = None,
                            generated: dict[int, list[dict]] | None = None) -> tuple[list[dict], list[str]]:
    """``build_rows`` and, per row, where it came from: ``curated``, ``self_generated`` or ``agent`` (data.file)."""
    pairs = _library(spec, None, generated)
    if spec.data.file:
        for row in read_data_file(Path(job_dir) / spec.data.file):
            pairs.append(("agent", dict(row, family=row.get("family") or default_family)))
    # Columns must agree across rows for datasets.Dataset.from_list: fill missing ones with None.
    keys = sorted({k for _, r in pairs for k in r})
    pairs = [(o, {k: r.get(k) for k in keys}) for o, r in pairs]
    random.Random(f"shuffle/{spec.seed}").shuffle(pairs)
    return [r for _, r in pairs], [o for o, _ in pairs]


def build_rows(spec, job_dir: str | Path, default_family: str | None = None,
               generated: dict[int, list[dict]] | None = None) -> list[dict]:
    """All training rows of a job (dicts with ``prompt``, ``answer``, ``family``), shuffled by the job seed.

    ``default_family`` (usually the task's family) labels file rows that carry no ``family``;
    ``generated`` is as in ``library_rows``. Raises ``DataFileError`` for a bad data file and
    ``FamilyError`` for a bad source.
    """
    return build_rows_with_origins(spec, job_dir, default_family, generated)[0]


# The training fields of a row as the model sees them, in the trainer's record of what it trained on
# (``TRAINED_ROWS``, one JSON object per row, written by ``agent_trainer.inner_loop.train.stages``).
TRAINED_FIELDS = ("prompt", "answer", "chosen", "rejected")
TRAINED_ROWS = "trained_rows.jsonl"


def rendered_texts(row: dict, render=None) -> list[str]:
    """The texts a row trains the model on, as it reads them: ``prompt + answer`` (SFT's sequence, and GRPO's
    prompt with the completion its reward pays for) and DPO's ``prompt + chosen`` / ``prompt + rejected``;
    ``render``: the prompt in the job's format (``evaluation.prompts.render``), as the trainer passes it."""
    prompt = row.get("prompt") if isinstance(row.get("prompt"), str) else ""
    prompt = render(prompt) if render is not None else prompt
    return [prompt + row[k] for k in ("answer", "chosen", "rejected") if isinstance(row.get(k), str)]


def trained_record(rows: list[dict]) -> list[dict]:
    """The training fields of ``rows`` (what ``TRAINED_ROWS`` holds per row)."""
    return [{k: r[k] for k in TRAINED_FIELDS if isinstance(r.get(k), str)} for r in rows]


def data_source_label(origins) -> str:
    """One word for the origins of the rows a stage trained on: the origin, or ``mixed`` for several."""
    kinds = set(origins)
    return kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "none"
