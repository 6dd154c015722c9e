"""Contamination on the base model's own token ids (``agent_trainer.evaluation.token_overlap``), round 4's attacks.

Every hidden item behind glue the tokenizer splits off (an ASCII letter glued to ``calc``, a five-digit prefix, a mark,
a non-ASCII letter) is flagged with the project's tiny BPE and with SmolLM2's, in the raw and the chat format; every
built-in family's clean training rows are not (the counts: docs/results/2026-12-07-red-team-rounds.md); long items
are found with a few tokens changed and cut into pieces over rows.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from agent_trainer.evaluation.contamination import find_overlap
from agent_trainer.evaluation.families import BUILT_IN, get_family
from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.evaluation.prompts import RAW, for_family
from agent_trainer.evaluation.token_overlap import TokenJudge
from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

N = 200
CACHE = Path(os.environ.get("AGENT_TRAINER_CACHE", Path.home() / ".cache" / "agent-trainer"))
SMOL = CACHE / "models" / "smollm2-135m-v1"
GLUES = ["x", "Q", "50494", "%", "#", "é", "ж", "字", "_", "7"]


@pytest.fixture(scope="module")
def tokenizers():
    out = {"tiny": build_tokenizer()}
    if (SMOL / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        out["smollm2"] = AutoTokenizer.from_pretrained(SMOL, local_files_only=True)
    return out


def test_a_glued_letter_the_character_rule_misses_is_flagged_on_token_ids(tokenizers):
    """Round 4's attack: each hidden item five times behind one glued letter (``xcalc: 11-3-3=``)."""
    hidden = [e for e in hidden_set("calc_chain", N)]
    rows = [(f"line {i}", "x" + e.prompt + e.answer) for i, e in enumerate(hidden) for _ in range(5)]
    assert not find_overlap("calc_chain", N, rows).flagged, "the character rule alone misses it (why this judge exists)"
    for name, tok in tokenizers.items():
        for fmt in (RAW, for_family("calc_chain", "chat")):
            r = find_overlap("calc_chain", N, rows, tokenizer=tok, fmt=fmt)
            assert r.flagged and r.hits == N and r.kinds["token"] == N, (name, fmt.kind, r.summary())


@pytest.mark.parametrize("family", sorted(BUILT_IN))
def test_glue_of_any_class_in_front_or_behind_every_hidden_item_is_flagged(tokenizers, family):
    items = hidden_set(family, 50)
    for name, tok in tokenizers.items():
        judge = TokenJudge(tok, [e.prompt for e in items])
        for glue in GLUES:
            texts = [glue + e.prompt + e.answer for e in items] + [e.prompt + glue + e.answer for e in items]
            found = {(t % len(items), j) for t, _, j in judge.scan(texts)}
            missed = [items[i].prompt for i in range(len(items)) if (i, i) not in found]
            assert not missed, (name, glue, missed[:3])


@pytest.mark.parametrize("family", sorted(BUILT_IN))
def test_no_clean_training_row_of_a_built_in_family_is_flagged(tokenizers, family):
    """Rows of the training pool from seeds the template sample does not use, alone and as one job."""
    from agent_trainer.evaluation.prompts import render

    examples = [(s, i, e) for s in (1, 2) for i, e in enumerate(get_family(family).training_examples(seed=s, n=1000))]
    for name, tok in tokenizers.items():
        for fmt in (RAW, for_family(family, "chat")):
            # As the trainer renders them: in the chat format the template (with the family's instruction) as well.
            rows = [(f"seed {s} row {i}", render(tok, e.prompt, fmt) + e.answer) for s, i, e in examples]
            r = find_overlap(family, N, rows, tokenizer=tok, fmt=fmt)
            assert not r.flagged, (name, fmt.kind, r.summary())


def _sentences(rng: random.Random, n: int, words: int = 40) -> list[str]:
    # Words of a data set's prompts: 400 made-up words of 3 to 7 letters (fixed by the seed).
    letters = random.Random(1)
    vocab = ["".join(letters.choice("abcdefghijklmnoprstuw") for _ in range(letters.randint(3, 7))) for _ in range(400)]
    return [" ".join(rng.choice(vocab) for _ in range(words)) + " ?" for _ in range(n)]


def test_long_items_are_found_with_tokens_changed_and_in_pieces_over_rows(tokenizers):
    rng = random.Random(0)
    hidden, public, clean = _sentences(rng, 50), _sentences(rng, 500), _sentences(rng, 500)
    for name, tok in tokenizers.items():
        judge = TokenJudge(tok, hidden, public)
        assert not judge.scan(clean) and not judge.spread_hits(), name
        changed = []
        for p in hidden:
            words = p.split(" ")
            words[len(words) // 2] = "the" if words[len(words) // 2] != "the" else "a"  # a word changed, one added
            words.insert(10, "the")
            changed.append("note: " + " ".join(words))
        assert {j for _, kind, j in judge.scan(changed) if kind == "token-near"} == set(range(50)), name
        judge = TokenJudge(tok, hidden, public)
        halves = [h for p in hidden for h in (p[: len(p) // 2], "intro " + p[len(p) // 2:])]
        assert not judge.scan(halves)
        assert {j for _, j in judge.spread_hits()} == set(range(50)), name


def test_the_job_check_reads_rows_as_the_trainer_renders_them(tmp_path):
    """``check_job`` with the base model's folder: the data file of the attack is flagged in the checking child."""
    if not (SMOL / "tokenizer.json").is_file():
        pytest.skip(f"needs SmolLM2's folder at {SMOL} (at-models)")
    import yaml

    from agent_trainer.inner_loop.isolation.contamination import check_job
    from agent_trainer.inner_loop.spec.jobspec import load_job

    job = tmp_path / "job"
    job.mkdir()
    rows = [{"prompt": "x" + e.prompt, "answer": e.answer} for e in hidden_set("calc_chain", N)]
    (job / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "sft", "seed": 0,
        "hyperparameters": {"learning_rate": 1e-3, "batch_size": 8, "max_steps": 2}, "data": {"file": "data.jsonl"}}))
    spec = load_job(job)
    fmt = for_family("calc_chain", "chat")
    assert not check_job(spec, job, "calc_chain", N).flagged, "without the model's tokens it passes (round 4)"
    r = check_job(spec, job, "calc_chain", N, model_dir=SMOL, fmt=fmt)
    assert r.flagged and r.kinds["token"] == N, r.summary()


def test_the_folder_tokenizer_reads_as_transformers_does(tmp_path):
    """The checking child's tokenizer (no transformers import): the same ids, offsets, pieces and chat renders."""
    from transformers import AutoTokenizer

    from agent_trainer.evaluation.folder_tokenizer import FolderTokenizer
    from agent_trainer.evaluation.prompts import render

    build_tokenizer().save_pretrained(tmp_path / "tiny")
    folders = [tmp_path / "tiny"] + ([SMOL] if (SMOL / "tokenizer.json").is_file() else [])
    texts = ["calc: 11-3-3=", "xcalc:  11 -3-3=5", "триаж: é 字 \u00a0 x", "<|im_start|>user\nhi<|im_end|>"]
    for folder in folders:
        ours, theirs = FolderTokenizer.load(folder), AutoTokenizer.from_pretrained(folder, local_files_only=True)
        assert len(ours) == len(theirs)
        for t in texts:
            a = ours(t, add_special_tokens=False, return_offsets_mapping=True)
            b = theirs(t, add_special_tokens=False, return_offsets_mapping=True)
            assert a["input_ids"] == b["input_ids"] and [tuple(o) for o in a["offset_mapping"]] == \
                [tuple(o) for o in b["offset_mapping"]], (folder, t)
        ids = list(range(0, len(ours), 97))
        assert ours.batch_decode([[i] for i in ids]) == theirs.batch_decode([[i] for i in ids])
        assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
        for fmt in (for_family("calc_chain", "chat"), for_family("triage", "chat")):
            assert render(ours, "calc: 11-3-3=", fmt) == render(theirs, "calc: 11-3-3=", fmt), folder


def test_sampled_trained_rows_are_judged_on_token_ids_after_training(tmp_path):
    """``check_trained`` in its child with the base model's folder: a sampled stage's glued hidden row is flagged."""
    import yaml

    from agent_trainer.inner_loop.isolation.contamination import check_trained
    from agent_trainer.inner_loop.spec.jobspec import load_job
    from agent_trainer.inner_loop.train.data import TRAINED_ROWS

    job, out = tmp_path / "job", tmp_path / "out"
    job.mkdir()
    out.mkdir()
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "sft", "seed": 0, "hyperparameters": {"max_steps": 2},
        "data": {"sources": [{"family": "calc_chain", "size": 16, "self_generated": {"samples_per_prompt": 2}}]},
        "reward": {"functions": [{"name": "exact_match"}]}}))
    build_tokenizer().save_pretrained(tmp_path / "tiny")
    h = hidden_set("calc_chain", N)[7]
    rows = [{"prompt": "calc: 1+2=", "answer": "3"}, {"prompt": "q" + h.prompt, "answer": h.answer}]
    (out / TRAINED_ROWS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = load_job(job)
    assert not check_trained(spec, job, out, "calc_chain", N).flagged, "the character rule alone misses it"
    r = check_trained(spec, job, out, "calc_chain", N, model_dir=tmp_path / "tiny", fmt=for_family("calc_chain", "chat"))
    assert r.flagged and r.kinds["token"] == 1, r.summary()
