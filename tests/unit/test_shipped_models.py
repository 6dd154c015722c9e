"""The project's own models ship as files: the same bytes on every machine, their sha256s checked at load.

    .venv/bin/pytest tests/unit/test_shipped_models.py -q        (~10 s)
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from agent_trainer.inner_loop.models import registry
from agent_trainer.inner_loop.models.build import file_sha256
from agent_trainer.paths import PROJECT_ROOT

SHIPPED = ("tiny-s", "tiny-m", "tiny-agent")


def test_the_tiny_models_resolve_to_the_shipped_files_with_their_published_sha256s(tmp_path):
    sums = registry.shipped_models()
    assert set(SHIPPED) <= set(sums)
    published = (PROJECT_ROOT / "docs" / "baselines.md").read_text()
    for name in SHIPPED:
        path = registry.resolve_model(name, cache_dir=tmp_path)
        assert registry.provenance(path) == "shipped" and not (tmp_path / "models").exists(), "nothing is built"
        weights = file_sha256(path / "model.safetensors")
        assert weights == sums[name]["files"]["model.safetensors"]
        assert re.search(rf"`{name}`.*`{weights}`", published), f"docs/baselines.md publishes {name}'s sha256"
    total = sum(p.stat().st_size for p in registry.SHIPPED_DIR.rglob("*") if p.is_file())
    assert total < 5e6, f"the shipped models stay small ({total / 1e6:.1f} MB)"


def test_a_changed_byte_in_a_shipped_file_is_refused_at_load(tmp_path, monkeypatch):
    copy = tmp_path / "shipped"
    shutil.copytree(registry.SHIPPED_DIR, copy)
    monkeypatch.setattr(registry, "SHIPPED_DIR", copy)
    monkeypatch.setattr(registry, "_VERIFIED", set())
    weights = copy / "tiny-s" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(registry.ModelError, match="model.safetensors has sha256 .*reinstall"):
        registry.resolve_model("tiny-s", cache_dir=tmp_path)
    assert registry.resolve_model("tiny-m", cache_dir=tmp_path) == copy / "tiny-m"


def test_other_seeds_and_newer_build_versions_are_built_into_the_cache(tmp_path, monkeypatch):
    assert registry.model_dir("tiny-s", 1, tmp_path) == tmp_path / "models" / f"tiny-s-seed1-v{registry.BUILD_VERSION}"
    assert registry.model_dir("tiny-s", 0, tmp_path, local=True).parent == tmp_path / "models"
    sums = json.loads((registry.SHIPPED_DIR / registry.SHIPPED_SUMS).read_text())
    sums["models"]["tiny-s"]["version"] = registry.BUILD_VERSION - 1
    (tmp_path / "shipped").mkdir()
    (tmp_path / "shipped" / registry.SHIPPED_SUMS).write_text(json.dumps(sums))
    monkeypatch.setattr(registry, "SHIPPED_DIR", tmp_path / "shipped")
    assert registry.shipped_dir("tiny-s") is None, "shipped bytes of an older build are not this code's model"


def test_the_tokenizer_built_from_code_is_the_shipped_tokenizer(tmp_path):
    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    for name in SHIPPED:
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            assert (tmp_path / f).read_bytes() == (registry.SHIPPED_DIR / name / f).read_bytes(), (name, f)
