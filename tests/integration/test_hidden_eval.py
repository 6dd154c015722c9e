"""Hidden evaluation and the baseline cache, on real (tiny) checkpoints."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agent_trainer.evaluation.baselines import BASELINES_FILE, baseline_table, get_baseline, lookup_baseline
from agent_trainer.evaluation.families import FAMILIES, get_family
from agent_trainer.evaluation.hidden_eval import (
    EvalError, generate_completions, hidden_set, load_checkpoint, score_checkpoint,
)
from agent_trainer.inner_loop.models import TINY_S, build_model

SMALL = dataclasses.replace(TINY_S, name="tiny-test", hidden_size=32, num_layers=1, intermediate_size=64, steps=40,
                            batch_size=32, warmup_steps=5)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("small")
    manifest = build_model(SMALL, path, seed=0)
    return path, manifest


def test_score_checkpoint_reports_score_hash_and_samples(small_model):
    path, manifest = small_model
    result = score_checkpoint(path, "count_char", n=40)
    assert result.family == "count_char" and result.version == 1 and result.n == 40
    assert 0.0 <= result.score <= 1.0 and result.seconds > 0
    assert result.model_hash == manifest["files"]["model.safetensors"]
    assert [s["prompt"] for s in result.samples] == [e.prompt for e in hidden_set("count_char", 5)]


def test_batched_generation_matches_one_by_one(small_model):
    model, tok = load_checkpoint(small_model[0])
    prompts = [e.prompt for e in hidden_set("triage", 12)]  # different lengths: left padding matters
    fam = get_family("triage")
    batched = generate_completions(model, tok, prompts, fam.max_new_tokens, batch_size=12)
    single = [generate_completions(model, tok, [p], fam.max_new_tokens, batch_size=1)[0] for p in prompts]
    assert batched == single


def test_bad_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(EvalError, match="no config.json"):
        score_checkpoint(tmp_path, "calc_chain", n=5)


def test_baseline_is_computed_once_then_read_from_the_cache(small_model, tmp_path):
    path, _ = small_model
    assert lookup_baseline(path, "reverse_text", n=16, cache_dir=tmp_path) is None
    value = get_baseline(path, "reverse_text", n=16, cache_dir=tmp_path)
    assert lookup_baseline(path, "reverse_text", n=16, cache_dir=tmp_path) == value
    assert lookup_baseline(path, "reverse_text", n=17, cache_dir=tmp_path) is None
    # Edit the stored value: a cached baseline is read back, not recomputed.
    store = tmp_path / BASELINES_FILE
    data = json.loads(store.read_text())
    (key,) = data
    assert key.startswith(small_model[1]["files"]["model.safetensors"]) and key.endswith("/reverse_text/v1/n16")
    data[key]["score"] = 0.123
    store.write_text(json.dumps(data))
    assert get_baseline(path, "reverse_text", n=16, cache_dir=tmp_path) == 0.123


@pytest.mark.slow
def test_built_models_baselines_are_low_nonzero_and_ordered(built_models, tmp_path):
    table = baseline_table({"tiny-s": built_models["tiny-s"], "tiny-m": built_models["tiny-m"]}, n=200,
                           cache_dir=tmp_path)
    for family in FAMILIES:
        s, m = table.scores["tiny-s"][family], table.scores["tiny-m"][family]
        assert 0.02 <= s < m <= 0.5, f"{family}: tiny-s {s:.3f}, tiny-m {m:.3f}\n{table.markdown}"
