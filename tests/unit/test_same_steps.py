"""bench/same_steps.py: two runs are the same step by step when every key but clocks is equal."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("same_steps", ROOT / "bench" / "same_steps.py")
same_steps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(same_steps)


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_clocks_may_differ_and_nothing_else(tmp_path, capsys):
    a = [{"step": 0, "reward_mean": 0.25, "seconds_step": 30.0, "usd": 0.001, "usd_measured_cumulative": 0.001,
          "cache_hits": 0}]
    b = [{"step": 0, "reward_mean": 0.25, "seconds_step": 41.5, "usd": 0.001, "usd_measured_cumulative": 0.002,
          "cache_hits": 3}]
    assert same_steps.main([write(tmp_path / "a", a), write(tmp_path / "b", b)]) == 0
    assert "same: 1 steps x 3 keys" in capsys.readouterr().out
    # the dollars the ledger charges are compute: compared
    assert same_steps.main([write(tmp_path / "a", a), write(tmp_path / "b", [{**b[0], "usd": 0.002}])]) == 1
    assert "step 0: usd" in capsys.readouterr().out
    b[0]["reward_mean"] = 0.2500001
    assert same_steps.main([write(tmp_path / "a", a), write(tmp_path / "b", b)]) == 1
    assert "step 0: reward_mean" in capsys.readouterr().out
    assert same_steps.main([write(tmp_path / "a", a), write(tmp_path / "c", a * 2)]) == 1, "a missing step differs"


def test_common_compares_the_shared_keys_and_names_the_others(tmp_path, capsys):
    a = [{"step": 0, "reward_mean": 0.25, "old_metric": 1.0}]
    b = [{"step": 0, "reward_mean": 0.25, "new_metric": 0.5}]
    pa, pb = write(tmp_path / "a", a), write(tmp_path / "b", b)
    assert same_steps.main([pa, pb]) == 1, "without --common a key in one run only is a difference"
    capsys.readouterr()
    assert same_steps.main([pa, pb, "--common"]) == 0
    out = capsys.readouterr().out
    assert "only in the first run (not compared): old_metric" in out and "only in the second run" in out
    assert "new_metric" in out and "same: 1 steps x 2 keys" in out
    b[0]["reward_mean"] = 0.3
    assert same_steps.main([pa, write(tmp_path / "b", b), "--common"]) == 1, "shared keys still compared"
