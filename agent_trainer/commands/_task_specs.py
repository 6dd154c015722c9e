"""The task spec of every family ``at-train`` plays, found before anything runs and kept in the run folder.

For each training and held-out family, in order:

1. ``task.spec_pattern`` with ``{family}`` replaced (``examples/tasks/calc_chain_v1_tiny.json``);
2. a file of that name next to the family's card, in a folder of ``task.include_path``
   (``examples/families/word_math_v1_fast.json``);
3. for a family that has a card but no spec: a spec made from the card and the pattern's spec of another
   family (its base models, budget and hidden-set size: the experiment's tier), the hidden-set size capped at
   the card's hidden rows.

The specs are written to ``<run folder>/task_specs/<family>.json`` and the run reads them from there (the
record of what it played). A family found nowhere is one error naming ``task.spec_pattern`` and
``task.include_path``, in a dry run as well.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent_trainer import cli
from agent_trainer.config import Config
from agent_trainer.paths import resolve_path

SPEC_DIR = "task_specs"


def families_played(conf: Config) -> tuple[list[str], list[str]]:
    """The training families (``task.train_families``, else the family of ``task.spec_path``) and the held-out ones."""
    train = list(conf.task.train_families)
    if not train:
        from agent_trainer.evaluation.tasks import load_task

        train = [load_task(resolve_path(conf.task.spec_path)).family]
    return train, list(conf.task.held_out_families)


def _found(conf: Config, family: str) -> Path | None:
    """The spec file of ``family`` by the pattern, or by the pattern's file name in an include folder."""
    path = resolve_path(conf.task.spec_pattern.format(family=family))
    if path.is_file():
        return path
    for folder in conf.task.include_path:
        beside = resolve_path(folder) / path.name
        if beside.is_file():
            return beside
    return None


def _from_card(family: str, reference: dict | None) -> dict | None:
    """A spec for a family that has a card (a registered data family) but no spec file; None when it has none."""
    from agent_trainer.evaluation.families import BUILT_IN, FAMILIES

    if family not in FAMILIES or family in BUILT_IN:   # a broken card on the include path fails here, as itself
        return None  # (a built-in family's spec files ship in examples/tasks: the pattern must find one)
    cls = FAMILIES[family]
    spec = {k: v for k, v in (reference or {}).items()
            if k in ("allowed_base_models", "budget", "hidden_eval_size", "prompt_format")}
    tier = str((reference or {}).get("name", "_fast")).rsplit("_", 1)[-1]
    spec.update(name=f"{family}_v{cls.version}_{tier}", family=family, version=cls.version)
    rows = getattr(cls, "rows", None)
    if rows:
        fam = cls()
        hidden = len({r.prompt for r in rows if fam.in_hidden(r.prompt)})
        spec["hidden_eval_size"] = max(1, min(int(spec.get("hidden_eval_size", 200)), hidden))
    return spec


def resolve_specs(conf: Config, folder: Path) -> dict[str, Path]:
    """Write the spec of every family the run plays to ``<folder>/task_specs/`` and point ``conf.task.spec_pattern``
    there; returns ``{family: where its spec came from}``. ``cli.UserError`` names every family without one."""
    from agent_trainer.evaluation.tasks import load_task

    train, held = families_played(conf)
    families = list(dict.fromkeys(train + held))
    found = {f: _found(conf, f) for f in families}
    reference = next((json.loads(p.read_text()) for p in found.values() if p is not None), None)
    if reference is None:   # no family's spec matched: a built-in one's file under the same pattern, if any
        builtin = resolve_path(conf.task.spec_pattern.format(family="calc_chain"))
        reference = json.loads(builtin.read_text()) if builtin.is_file() else None
    out = folder / SPEC_DIR
    out.mkdir(parents=True, exist_ok=True)
    sources: dict[str, Path] = {}
    missing = []
    for f in families:
        target = out / f"{f}.json"
        if found[f] is not None:
            load_task(found[f])   # a bad spec fails here, with its file's name
            target.write_text(found[f].read_text())
            sources[f] = found[f]
            continue
        spec = _from_card(f, reference)
        if spec is None:
            missing.append(f)
            continue
        target.write_text(json.dumps(spec, indent=2) + "\n")
        load_task(target)
        sources[f] = target
    if missing:
        include = ", ".join(conf.task.include_path) or "empty"
        raise cli.UserError(
            f"no task spec for famil{'ies' if len(missing) > 1 else 'y'} {', '.join(missing)}: "
            f"task.spec_pattern={conf.task.spec_pattern!r} finds no "
            f"{', '.join(repr(conf.task.spec_pattern.format(family=f)) for f in missing)} and no family card of that "
            f"name is on task.include_path ({include}); add the folder with its .yaml card to task.include_path, "
            f"or set task.spec_pattern to where its spec is")
    conf.task.spec_pattern = str(out / "{family}.json")
    return sources


def check_answer_room(conf: Config, tasks=None) -> None:
    """Every task played (``tasks``: ``TaskSpec``s; default every family at-train plays, after ``resolve_specs``)
    must leave room for its answers in the tokens of each allowed base model that is here
    (``hidden_eval.answer_room_problem``): else every job of it would train and then score 0. ``cli.UserError``
    names the family, the answer and the model."""
    from transformers import AutoTokenizer

    from agent_trainer.evaluation.families import get_family
    from agent_trainer.evaluation.hidden_eval import answer_room_problem, hidden_set
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.inner_loop.models import resolve_model

    if tasks is None:
        train, held = families_played(conf)
        tasks = [load_task(conf.task.spec_pattern.format(family=f)) for f in dict.fromkeys(train + held)]
    tokenizers: dict[str, object] = {}
    for spec in tasks:
        family = get_family(spec.family)
        examples = hidden_set(spec.family, conf.inner.eval_size or spec.hidden_eval_size)
        for name in spec.allowed_base_models:
            if name not in tokenizers:
                try:
                    path = resolve_model(name, cache_dir=conf.cache_dir, build_missing=False, progress=False)
                except Exception:   # not built or imported here yet: its first job builds it (or says why)
                    path = None
                tokenizers[name] = path and AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            if tokenizers[name] is None:
                continue
            problem = answer_room_problem(tokenizers[name], family, examples, model=name)
            if problem:
                raise cli.UserError(problem)


def heldout_warning(conf: Config) -> str | None:
    """A line when held-out families are configured but this run never evaluates them."""
    held = list(conf.task.held_out_families)
    o = conf.outer
    if not held or (o.heldout_every > 0 and o.heldout_episodes > 0):
        return None
    why = f"outer.heldout_every={o.heldout_every}" if o.heldout_every <= 0 else \
        f"outer.heldout_episodes={o.heldout_episodes}"
    return (f"at-train: warning: task.held_out_families={held} are never evaluated in this run ({why}); "
            f"set outer.heldout_every=<steps> and outer.heldout_episodes=<n> to score them")
