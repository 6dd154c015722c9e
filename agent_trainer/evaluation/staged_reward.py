"""Staged reward of an episode: validation, job success, quality (uplift), speed; each kept apart.

    r = staged_reward(validation_failures=1,
                      job=JobOutcome(status="ok", post_score=0.30, baseline=0.12, train_seconds=40,
                                     budget_seconds=90))
    r.total, r.to_dict()

``train_seconds`` and ``budget_seconds`` are compute (the cost model's estimate of what the job asked for,
and the task's compute budget), never measured seconds: the same job earns the same speed on any machine
under any load. A job the wall-clock safety cap killed (``infra_timeout``) is the machine's fault: its reward
is ``excluded`` (zero, and marked so that an update can leave the episode out).
All weights are the config's ``outer.reward`` (``agent_trainer.config.RewardConfig``). Each stage's formula and why:
docs/outer_loop.md, "Staged reward".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from agent_trainer.config import RewardConfig


REFUSED = ("invalid", "over_budget")   # job statuses of a submission the harness did not run


@dataclass(frozen=True)
class JobOutcome:
    """What the harness knows about the job an episode is judged by (plain numbers, no imports); the seconds are
    compute (see the module docstring)."""

    status: str
    post_score: float | None = None
    baseline: float | None = None
    train_seconds: float = 0.0
    budget_seconds: float = 1.0
    flagged: bool = False


@dataclass(frozen=True)
class StagedReward:
    """Every stage, the numbers behind quality, and the weighted total."""

    validation: float
    job_success: float
    quality: float
    speed: float
    total: float
    post_score: float | None = None
    baseline: float | None = None
    uplift: float | None = None
    normalized_uplift: float | None = None
    flagged: bool = False
    excluded: bool = False    # an infrastructure fault (infra_timeout): not the agent's doing, leave it out
    weights: RewardConfig = field(default_factory=RewardConfig)

    def to_dict(self) -> dict:
        """Flat dict for MLflow metrics and trajectory files (weights under ``w_``)."""
        d = {k: v for k, v in asdict(self).items() if k != "weights"}
        d.update({f"w_{k}": v for k, v in asdict(self.weights).items()})
        return d


def _clip(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def validation_score(failures: int | None, decay: float = 0.5) -> float:
    """1.0 valid at the first try, ``decay ** failures`` after retries, 0 when never valid (None)."""
    if failures is None:
        return 0.0
    if failures < 0:
        raise ValueError(f"failures must be >= 0 or None, got {failures}")
    return decay ** failures


def normalized_uplift(post: float, baseline: float) -> float:
    """Gain as a share of the headroom ``1 - baseline``, loss as a share of ``baseline``; in [-1, 1]."""
    uplift = post - baseline
    room = 1.0 - baseline if uplift >= 0 else baseline
    return _clip(uplift / max(1e-6, room), -1.0, 1.0)


def staged_reward(validation_failures: int | None, job: JobOutcome | None,
                  weights: RewardConfig | None = None) -> StagedReward:
    """The staged reward of one episode; ``job`` None when nothing was submitted (or none ran)."""
    w = weights or RewardConfig()
    if job is not None and job.status == "infra_timeout":
        return StagedReward(validation=0.0, job_success=0.0, quality=0.0, speed=0.0, total=0.0, excluded=True,
                            weights=w)
    validation = validation_score(validation_failures, w.validation_decay)
    if job is None:
        validation *= w.validation_without_job
    success = quality = speed = 0.0
    post = base = up = nup = None
    flagged = bool(job and job.flagged)
    if job is not None:
        scored = job.status in ("ok", "timeout") and job.post_score is not None and job.baseline is not None
        if scored:
            base = float(job.baseline)
            post = base if flagged else float(job.post_score)
            up = post - base
            nup = normalized_uplift(post, base)
    # A flagged job (trained on hidden items: the contamination, trained-rows or oracle checks) earns what a refused
    # one does: no success, quality or speed, so a disguised try never pays more than an honest job that did nothing.
    if job is not None and not flagged:
        success = 1.0 if job.status == "ok" else 0.0
        if post is not None:
            quality = w.post * post + w.uplift * nup
            if job.status == "timeout" and quality > 0:
                # Only the credit is cut: a harmful model that also ran out of time keeps its whole penalty,
                # or slowing a bad job down would pay.
                quality *= w.timeout_quality_factor
        if job.status == "ok":
            speed = _clip(1.0 - job.train_seconds / max(1e-9, job.budget_seconds), 0.0, 1.0)
    total = w.validation * validation + w.success * success + w.quality * quality + w.speed * speed
    if job is not None and (job.status in REFUSED or flagged):
        total -= w.invalid_job
    return StagedReward(validation=validation, job_success=success, quality=quality, speed=speed, total=total,
                        post_score=post, baseline=base, uplift=up, normalized_uplift=nup, flagged=flagged, weights=w)
