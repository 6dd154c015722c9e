"""The trace's digests and its comparison (``agent_trainer.trace``), on hand-made tensors and records.

    .venv/bin/python -m pytest tests/unit/test_trace.py -q        (seconds)
"""

from __future__ import annotations

import json

import pytest
import torch

from agent_trainer import trace


def _ulp(t: torch.Tensor, at: int = 0) -> torch.Tensor:
    """``t`` with element ``at`` moved by one unit in the last place."""
    out = t.clone()
    out.view(torch.int32).view(-1)[at] += 1
    return out


def test_rounding_keeps_the_named_mantissa_bits_to_nearest():
    x = torch.tensor([1.0, 1.0 + 2 ** -22, 1.0 + 3 * 2 ** -22, -3.0 - 2 ** -22], dtype=torch.float32)
    back = trace.rounded(x, 20).view(torch.float32)
    # near 1 a step of 20 bits is 2^-20: a quarter step rounds down, three quarters up; the sign is kept
    assert back.tolist() == [1.0, 1.0, 1.0 + 2 ** -20, -3.0]


def test_one_ulp_parts_the_exact_hash_only():
    w = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    a = trace.weights_digest([("w", w)], tensors=True)
    b = trace.weights_digest([("w", _ulp(w, 5))], tensors=True)
    assert a["weights"] != b["weights"] and a["tensors"]["w"] != b["tensors"]["w"]
    assert a["weights@1e-4"] == b["weights@1e-4"]
    assert 0 < abs(a["weights_sum"] - b["weights_sum"]) < 1e-6
    assert trace.weights_digest([("w", w.clone())]) == {k: v for k, v in a.items() if k != "tensors"}


def _step(step: int, **values) -> dict:
    base = {"event": "step", "step": step, "completions": "c", "rewards": "r", "rng": "g", "loss": 0.5,
            "grad_norm": 1.0, "weights": f"w{step}", "weights@1e-6": f"m{step}", "weights@1e-4": f"k{step}",
            "weights_sum": 1.0, "weights_l2": 2.0}
    return {**base, **values}


def test_compare_names_the_first_step_and_quantity_in_causal_order():
    a = [{"event": "trace", "cpu": {"vendor": "GenuineIntel"}}, _step(1), _step(2), _step(3), _step(4)]
    b = [{"event": "trace", "cpu": {"vendor": "AuthenticAMD"}}, _step(1),
         _step(2, weights="x", weights_sum=1.0 + 3e-9),                # the update parts in the last bits
         _step(3, weights="x", loss=0.5000001),                         # its effect on the next loss
         _step(4, weights="x", completions="other", loss=0.6)]          # and later on what is sampled
    lines = trace.compare(a, b)
    assert lines[0].startswith("first difference: step 2, weights: exact apart, 1e-6 equal, 1e-4 equal")
    assert "|diff| 3e-09" in lines[0]
    assert lines[1].startswith("then: step 3, loss:") and lines[2].startswith("then: step 4, completions:")
    assert trace.compare(a, a) == []


def test_compare_reports_the_eval_apart_from_training():
    ev = {"event": "eval", "weights": "w", "weights@1e-6": "m", "weights@1e-4": "k", "weights_sum": 1.0,
          "answers": ["a", "b", "c"], "scored": {"3": 1.0, "17": 1.0}, "score": 0.01}
    other = {**ev, "answers": ["a", "x", "c"], "scored": {"3": 1.0, "22": 1.0}}
    lines = trace.compare([_step(1), ev], [_step(1), other])
    assert lines == ["first difference: eval, answers: 1 of 3 blocks differ (first: block 1)",
                     "then: eval, scored: scored only in A: 17; only in B: 22"]


def test_the_command_exits_0_1_and_2_with_a_one_line_error(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in [_step(1), _step(2)]) + "\n")
    b.write_text("\n".join(json.dumps(r) for r in [_step(1), _step(2, grad_norm=1.5)]) + "\n")
    assert trace.main([str(a), str(a)]) == 0
    assert trace.main([str(a), str(b)]) == 1
    assert "first difference: step 2, grad_norm: 1.0 vs 1.5" in capsys.readouterr().out
    for bad in (tmp_path / "missing.jsonl", tmp_path / "job.yaml"):
        if bad.name == "job.yaml":
            bad.write_text("base_model: tiny-s\n")
        assert trace.main([str(a), str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("value,expected", [("", False), ("0", False), ("1", True)])
def test_tracing_is_asked_for_by_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(trace.TRACE_ENV, value)
    assert trace.tracing() is expected
