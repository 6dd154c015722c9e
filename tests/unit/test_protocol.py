"""The decide answer's validation and the switch rule of the CONTINUE/SWITCH protocol."""

from __future__ import annotations

import pytest

from agent_trainer.outer_loop.strategy.protocol import Current, current_of, parse_decision, switch_hint

CUR = Current(algorithm="sft", data_source="curated", stage="sft")
SHOWN = [0.2, 0.21, 0.215]
OK = {"strategy": "full sft on curated data", "scores": [0.2, 0.21, 0.215], "decision": "CONTINUE",
      "reason": "the loss is still falling fast"}


@pytest.mark.parametrize("change,problem", [
    ({"decision": "maybe"}, "decision must be CONTINUE or SWITCH"),
    ({"scores": [0.2, 0.21]}, "last 3 dev score(s)"),
    ({"scores": [0.2, 0.21, 0.5]}, "do not match your dev scores"),
    ({"scores": ["a", 0.21, 0.215]}, "scores must be numbers"),
    ({"reason": "ok"}, "reason is too short"),
    ({"decision": "SWITCH"}, "SWITCH needs component"),
    ({"decision": "SWITCH", "component": "algorithm"}, "concrete alternative for algorithm: sft | grpo"),
    ({"decision": "SWITCH", "component": "algorithm", "alternative": "sft"}, "is your current algorithm"),
    ({"decision": "SWITCH", "component": "stage", "alternative": "sft>magic"}, "joined by '>'"),
    ({"decision": "SWITCH", "component": "data_source", "alternative": "internet"}, "curated | self_generated"),
    ({"mood": "good"}, "unknown argument(s) mood"),
    ({"scores": "0.2"}, "scores must be of type array"),
])
def test_malformed_answers_say_what_is_wrong(change, problem):
    decision, why = parse_decision({**OK, **change}, SHOWN, CUR)
    assert decision is None and problem in why


def test_valid_answers():
    d, why = parse_decision({**OK, "decision": "continue", "scores": [0.20, 0.21, 0.22]}, SHOWN, CUR)  # rounding ok
    assert why == "" and d.decision == "CONTINUE" and d.component is None
    d, _ = parse_decision({**OK, "decision": "SWITCH", "component": "stage", "alternative": "SFT>GRPO",
                           "reason": "refine with a reward after sft"}, SHOWN, CUR)
    assert (d.decision, d.component, d.alternative) == ("SWITCH", "stage", "sft>grpo")
    d, _ = parse_decision('{"strategy": "s", "scores": [], "decision": "SWITCH", "component": "data_source", '
                          '"alternative": "self_generated", "reason": "own samples are cleaner"}', [], CUR)
    assert d.alternative == "self_generated" and d.scores == []


def test_current_of_ran():
    ran = {"stages": [{"algorithm": "sft", "data_source": "curated", "steps": 5},
                      {"algorithm": "grpo", "data_source": "curated", "steps": 5},
                      {"algorithm": "dpo", "data_source": "self_generated", "steps": 0}]}
    assert current_of(ran) == Current("grpo", "curated", "sft>grpo") and current_of(None) == Current()


def test_switch_rule_fires_after_window_small_gains():
    assert switch_hint([0.2], base=0.195, window=2, min_gain=0.01) == ""           # one gain only
    assert switch_hint([0.2, 0.205], base=0.195, window=2, min_gain=0.01).startswith("Rule:")
    assert switch_hint([0.3, 0.305], base=0.195, window=2, min_gain=0.01) == ""   # the first gain was large
    assert switch_hint([0.3, None, 0.29, 0.295], base=None, window=2, min_gain=0.01)  # unscored jobs skipped
    assert "(+0.005, +0.005)" in switch_hint([0.2, 0.205], base=0.195, window=2, min_gain=0.01)
