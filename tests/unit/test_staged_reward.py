"""Staged reward: each stage on its own, the documented normalisation, weights, flagged jobs."""

from __future__ import annotations

import pytest

from agent_trainer.config import RewardConfig
from agent_trainer.evaluation.staged_reward import (
    JobOutcome, normalized_uplift, staged_reward, validation_score,
)


def ok_job(post=0.4, base=0.2, secs=30.0, budget=90.0, **kw):
    return JobOutcome(status="ok", post_score=post, baseline=base, train_seconds=secs, budget_seconds=budget, **kw)


@pytest.mark.parametrize("failures, want", [(0, 1.0), (1, 0.5), (3, 0.125), (None, 0.0)])
def test_validation_decays_per_retry(failures, want):
    assert validation_score(failures) == want
    assert staged_reward(failures, ok_job()).validation == want


def test_validating_without_submitting_earns_nothing():
    """A valid job that was never submitted achieved nothing: no validation credit (it would pay 0.35
    for stopping early, more than a submitted job that lowers the score)."""
    assert staged_reward(0, None).total == 0.0
    assert staged_reward(0, None, RewardConfig(validation_without_job=1.0)).validation == 1.0
    crashed = staged_reward(0, JobOutcome(status="crashed", train_seconds=1, budget_seconds=90))
    assert crashed.validation == 1.0    # submitted and valid: the stage counts


def test_a_share_of_validation_without_a_job_ranks_stopping_after_valid_between_the_others():
    """With ``validation_without_job`` = 0.25 and ``invalid_job`` = 0.2 (experiment=smollm2_cpu) the four ends
    of an episode rank: a valid job that ran > a valid file not submitted > nothing valid, nothing submitted >
    a refused submission; the kept share also halves per retry."""
    w = RewardConfig(validation_without_job=0.25, invalid_job=0.2)
    ran = staged_reward(0, ok_job(), w).total
    valid_kept = staged_reward(0, None, w)
    assert valid_kept.validation == 0.25 and valid_kept.total == pytest.approx(0.35 * 0.25)
    assert staged_reward(1, None, w).total == pytest.approx(0.35 * 0.25 * 0.5)
    nothing = staged_reward(None, None, w).total
    refused = staged_reward(None, JobOutcome(status="invalid"), w).total
    assert ran > valid_kept.total > nothing == 0.0 > refused


def test_validation_without_job_is_a_share():
    with pytest.raises(ValueError, match="validation_without_job must be in"):
        RewardConfig(validation_without_job=1.5)


@pytest.mark.parametrize("status", ["invalid", "over_budget"])
def test_invalid_job_ranks_below_no_job(status):
    """With ``invalid_job`` > 0 an episode that submits a job the harness refuses ends below one that submits
    nothing, and both below a valid job that ran; at 0 (the default) the first two tie."""
    refused = JobOutcome(status=status)
    w = RewardConfig(invalid_job=0.2)
    assert staged_reward(None, refused).total == staged_reward(None, None).total == 0.0
    assert staged_reward(None, refused, w).total == pytest.approx(-0.2)
    assert staged_reward(None, None, w).total == 0.0
    assert staged_reward(0, ok_job(post=0.2, base=0.2), w).total > 0.0
    assert staged_reward(0, JobOutcome(status="crashed"), w).total >= 0.0     # ran: not a refusal


def test_normalized_uplift_uses_the_room_it_had():
    assert normalized_uplift(0.6, 0.2) == pytest.approx(0.5)    # half of the headroom 0.8 won
    assert normalized_uplift(1.0, 0.9) == pytest.approx(1.0)
    assert normalized_uplift(0.1, 0.2) == pytest.approx(-0.5)   # half of the base's 0.2 lost
    assert normalized_uplift(0.0, 0.0) == 0.0
    assert normalized_uplift(1.0, 1.0) == 0.0
    assert -1.0 <= normalized_uplift(0.0, 1e-9) <= 1.0


def test_default_total_is_the_papers_mix():
    r = staged_reward(1, ok_job(post=0.6, base=0.2, secs=45, budget=90))
    assert (r.validation, r.job_success, r.speed) == (0.5, 1.0, 0.5)
    assert r.uplift == pytest.approx(0.4) and r.normalized_uplift == pytest.approx(0.5)
    assert r.quality == pytest.approx(0.25 * 0.6 + 0.75 * 0.5)
    assert r.total == pytest.approx(0.35 * 0.5 + 0.60 * r.quality + 0.05 * 0.5)
    d = r.to_dict()
    assert d["total"] == r.total and d["w_quality"] == 0.60 and d["w_uplift"] == 0.75


def test_weights_are_configurable():
    w = RewardConfig(validation=0.0, success=1.0, quality=0.0, speed=0.0)
    assert staged_reward(0, ok_job(), w).total == 1.0
    with pytest.raises(ValueError, match="must be >= 0"):
        RewardConfig(speed=-1)


def test_a_flagged_job_scores_as_its_baseline_and_earns_what_a_refused_one_does():
    """Caught training on hidden items pays less than a job that trained nothing: a disguise the checks might miss
    must not be a free try (it had earned success, speed and the baseline's quality like an honest job)."""
    clean, flagged = (staged_reward(0, ok_job(post=0.9, base=0.2)),
                      staged_reward(0, ok_job(post=0.9, base=0.2, flagged=True)))
    assert flagged.uplift == 0.0 and flagged.normalized_uplift == 0.0 and flagged.post_score == 0.2
    assert (flagged.job_success, flagged.quality, flagged.speed) == (0.0, 0.0, 0.0) and flagged.flagged
    idle = staged_reward(0, ok_job(post=0.2, base=0.2))
    refused = staged_reward(0, JobOutcome(status="invalid", train_seconds=0, budget_seconds=90))
    assert clean.total > idle.total > flagged.total == pytest.approx(refused.total)
    w = RewardConfig(invalid_job=0.2)
    assert staged_reward(0, ok_job(post=0.9, base=0.2, flagged=True), w).total == pytest.approx(
        staged_reward(0, JobOutcome(status="invalid", train_seconds=0, budget_seconds=90), w).total)


def test_failed_jobs_earn_no_quality_or_speed():
    crashed = staged_reward(0, JobOutcome(status="crashed", train_seconds=1, budget_seconds=90))
    assert (crashed.job_success, crashed.quality, crashed.speed) == (0.0, 0.0, 0.0)
    assert crashed.total == pytest.approx(0.35)
    timeout = staged_reward(0, JobOutcome(status="timeout", post_score=0.6, baseline=0.2, train_seconds=90,
                                          budget_seconds=90))
    full = staged_reward(0, ok_job(post=0.6, base=0.2, secs=90, budget=90))
    assert timeout.quality == pytest.approx(0.5 * full.quality) and timeout.speed == 0.0
    # A model made worse earns its whole penalty, timeout or not: running out of time never pays.
    for post in (0.0, 0.1):
        harm_ok = staged_reward(0, ok_job(post=post, base=0.2, secs=89, budget=90))
        harm_timeout = staged_reward(0, JobOutcome(status="timeout", post_score=post, baseline=0.2,
                                                   train_seconds=90, budget_seconds=90))
        assert harm_timeout.quality == harm_ok.quality < 0 and harm_timeout.total <= harm_ok.total


def test_a_worse_model_is_punished_and_speed_is_clipped():
    worse = staged_reward(0, ok_job(post=0.0, base=0.3, secs=500, budget=90))
    assert worse.normalized_uplift == -1.0 and worse.quality == pytest.approx(-0.75) and worse.speed == 0.0
    assert worse.total < staged_reward(0, None).total


def test_the_speed_stage_reads_the_cost_models_seconds_not_the_wall_clock():
    """Two runs of one job measure different seconds (machine load); the reward must not follow them."""
    from agent_trainer.inner_loop.spec.cost import CostModel, estimate_cost
    from agent_trainer.inner_loop.run.result import JobResult
    from agent_trainer.inner_loop.spec.jobspec import JobSpec

    spec = JobSpec.model_validate({"base_model": "tiny-m", "algorithm": "sft",
                                   "hyperparameters": {"batch_size": 32, "max_steps": 100},
                                   "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 64}]}})
    est = estimate_cost(spec, CostModel())
    assert est.train_seconds() == round(100 * est.step_seconds, 3) and est.train_seconds(40) < est.train_seconds()
    quiet, busy = ({"train": t, "train_estimated": est.train_seconds(100)} for t in (3.1, 5.7))
    runs = [JobResult("ok", "t", "calc_chain", "j", "o", "h", seconds=s) for s in (quiet, busy)]
    assert runs[0].train_seconds == runs[1].train_seconds == est.train_seconds(100)
    assert runs[0].outcome(90).train_seconds == est.train_seconds(100) and runs[0].outcome(90).budget_seconds == 90
    old = JobResult("ok", "t", "calc_chain", "j", "o", "h", seconds={"train": 4.2})
    assert old.train_seconds == 4.2, "a result stored before the estimate existed keeps its measured seconds"
