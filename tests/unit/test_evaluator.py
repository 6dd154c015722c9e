"""Evaluator agent: typed suggestions, the adoption check, the rule evaluator, and the LLM path."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_trainer.evaluation.tasks import load_task
from agent_trainer.outer_loop.agents.base import AgentBackend, Generation
from agent_trainer.outer_loop.strategy.evaluator import (
    JobRecord, LLMEvaluator, RuleEvaluator, Suggestion, adopted, parse_suggestions, suggestion_type,
)
from agent_trainer.outer_loop.strategy.strategy import label

ROOT = Path(__file__).resolve().parents[2]
TASK = load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json")


def rec(job, alg="sft", lr=1e-3, steps=20, peft=None, status="ok", dev=0.2, data="curated", stages=None):
    spec = {"base_model": "tiny-s", "algorithm": alg, "hyperparameters": {"learning_rate": lr, "max_steps": steps},
            "data": {"sources": [{"family": "calc_chain"}]}}
    if peft:
        spec["peft"] = {"r": 8}
    ran = {"stages": stages or [{"algorithm": alg, "peft": "lora" if peft else "full", "data_source": data,
                                 "steps": steps}]}
    return JobRecord(job=job, status=status, spec=spec, ran=ran, label=label(ran), dev_score=dev,
                     visible={"steps": steps, "loss_curve": [[1, 1.0], [steps, 0.5]]})


@pytest.mark.parametrize("s,after,expected", [
    (Suggestion("execution", "learning_rate", 3e-3), rec(2, lr=3e-3), True),
    (Suggestion("execution", "learning_rate", 3e-3), rec(2, lr=2e-3), True),       # moved towards it
    (Suggestion("execution", "learning_rate", 3e-3), rec(2, lr=1e-3), False),      # unchanged
    (Suggestion("execution", "learning_rate", "decrease"), rec(2, lr=5e-4), True),
    (Suggestion("execution", "learning_rate", "increase"), rec(2, lr=5e-4), False),
    (Suggestion("execution", "max_steps", 100), rec(2, steps=100), True),
    (Suggestion("strategy", "algorithm", "grpo"), rec(2, alg="grpo"), True),
    (Suggestion("strategy", "algorithm", "grpo"), rec(2), False),
    (Suggestion("strategy", "algorithm", "grpo"),
     rec(2, stages=[{"algorithm": "sft", "peft": "full", "data_source": "curated", "steps": 5},
                    {"algorithm": "grpo", "peft": "full", "data_source": "curated", "steps": 5}]), True),
    (Suggestion("strategy", "stage", "sft>grpo"),
     rec(2, stages=[{"algorithm": "sft", "peft": "full", "data_source": "curated", "steps": 5},
                    {"algorithm": "grpo", "peft": "full", "data_source": "curated", "steps": 5}]), True),
    (Suggestion("strategy", "data_source", "self_generated"), rec(2, data="self_generated"), True),
    (Suggestion("strategy", "data_source", "self_generated"), rec(2), False),
    (Suggestion("strategy", "adapter", "lora"), rec(2, peft=True), True),
    (Suggestion("execution", "base_model", "tiny-m"), rec(2), False),
])
def test_adoption_check(s, after, expected):
    assert adopted(s, rec(1), after) is expected


def test_suggestion_types_follow_their_target():
    assert suggestion_type("learning_rate") == "execution" and suggestion_type("algorithm") == "strategy"
    ok, dropped = parse_suggestions([
        {"type": "execution", "target": "learning_rate", "value": 1e-3},
        {"type": "strategy", "target": "learning_rate", "value": 1e-3},     # mistyped
        {"type": "strategy", "target": "data_source", "value": "self_generated", "text": "more data"},
        {"type": "execution", "target": "vibes", "value": 1},               # unknown target
        "nonsense", {"type": "strategy", "target": "algorithm"},           # not an object, no value
    ])
    assert [(s.type, s.target) for s in ok] == [("execution", "learning_rate"), ("strategy", "data_source")]
    assert len(dropped) == 4 and "is a execution suggestion" in dropped[0]


def test_rule_evaluator():
    ev = RuleEvaluator(min_gain=0.01)
    # too low a rate, few steps, no gain over the base: lr and max_steps (execution), another algorithm (strategy)
    e = ev.evaluate([rec(1, lr=1e-5, steps=20, dev=0.10)], base_dev=0.12, task=TASK)
    assert {(s.type, s.target, s.value) for s in e.suggestions} == {
        ("execution", "learning_rate", 1e-3), ("execution", "max_steps", 100), ("strategy", "algorithm", "grpo")}
    assert "-0.020 vs the base model" in e.evaluation and "training loss 1.000 -> 0.500" in e.analysis
    assert e.prediction == pytest.approx(0.10)
    diverged = ev.evaluate([rec(1), rec(2, lr=3e-2, status="diverged", dev=None)], base_dev=0.1, task=TASK)
    assert [(s.target, s.value) for s in diverged.suggestions] == [("learning_rate", 1e-2)]
    rising = ev.evaluate([rec(1, dev=0.2), rec(2, lr=2e-3, steps=100, dev=0.3)], base_dev=0.1, task=TASK)
    assert rising.suggestions == [] and rising.prediction == pytest.approx(0.35)
    assert "Suggestion (strategy): algorithm -> grpo" in e.text()


class OneAnswer(AgentBackend):
    model_name = "scripted-evaluator"

    def __init__(self, calls):
        self.calls = calls

    def generate(self, messages, tools=None, **kw):
        self.messages, self.tools = messages, tools
        return Generation(text="", tool_calls=self.calls, prompt_tokens=50, completion_tokens=30)


def test_llm_evaluator_parses_a_structured_answer():
    backend = OneAnswer([{"id": "c1", "name": "evaluate", "arguments": {
        "prediction": 0.3, "evaluation": "modest", "analysis": "lr low",
        "suggestions": [{"type": "execution", "target": "learning_rate", "value": "increase"},
                        {"type": "strategy", "target": "algorithm", "value": "grpo", "text": "try RL"}]}}])
    e = LLMEvaluator(backend).evaluate([rec(1)], base_dev=0.1, task=TASK)
    assert not e.malformed and e.prediction == 0.3 and [s.type for s in e.suggestions] == ["execution", "strategy"]
    assert backend.tools[0]["function"]["name"] == "evaluate"
    assert "job 1: ok, strategy full_sft/curated/single, dev score 0.200" in backend.messages[1]["content"]
    assert "hidden" not in backend.messages[1]["content"]
    bad = LLMEvaluator(OneAnswer([])).evaluate([rec(1)], base_dev=None, task=TASK)
    assert bad.malformed.startswith("no evaluate call") and bad.suggestions == []


@pytest.mark.slow
def test_llm_evaluator_through_the_tiny_local_agent(tmp_path, built_agent):
    """The LLM path works through a real backend: a call is made, charged to the ledger, parsed or logged."""
    from agent_trainer.outer_loop.agents.local import LocalBackend
    from agent_trainer.outer_loop.episode.ledger import Ledger

    ledger = Ledger.open(tmp_path)
    ev = LLMEvaluator(LocalBackend.from_path(built_agent, device="cpu"), model_name="tiny-agent",
                      max_new_tokens=96, ledger=ledger)
    e = ev.evaluate([rec(1), rec(2, alg="grpo", dev=0.25)], base_dev=0.1, task=TASK, episode="e0", seed=0)
    assert e.tokens_in > 100 and e.tokens_out > 0
    assert bool(e.malformed) != bool(e.evaluation or e.suggestions or e.prediction is not None)
    tot = ledger.episode_totals("e0")
    assert (tot.llm_calls, tot.tokens_in, tot.tokens_out) == (1, e.tokens_in, e.tokens_out)
    ledger.close()


def test_the_rule_evaluator_takes_strategy_rule_min_gain():
    """``strategy.rule_min_gain`` sets both the CONTINUE/SWITCH hint's and the rule evaluator's idea of progress: a
    gain of 0.03 is progress at 0.01 and none at 0.05 (the evaluator had kept 0.01 whatever the setting)."""
    from agent_trainer.config import EvaluatorConfig, EvaluatorKind, StrategyConfig
    from agent_trainer.outer_loop.strategy.steering import make_steering

    history = [rec(1, lr=1e-3, steps=100, dev=0.20), rec(2, lr=1e-3, steps=100, dev=0.23)]
    targets = {}
    for gain in (0.01, 0.05):
        s = StrategyConfig(evaluator=EvaluatorConfig(kind=EvaluatorKind.rule), rule_min_gain=gain)
        ev = make_steering(s, device="cpu").evaluator
        assert ev.min_gain == gain
        targets[gain] = {x.target for x in ev.evaluate(history, base_dev=0.1, task=TASK).suggestions}
    assert targets[0.01] != targets[0.05], targets
