"""Budgets in compute, not seconds: the cost model's compute is the same on any machine, the budget guard
counts steps, the wall clock is a safety cap well above the estimate, and hitting it is excluded from rewards.

    .venv/bin/pytest tests/unit/test_compute_budget.py -q        (~2 s)
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from agent_trainer.evaluation.staged_reward import JobOutcome, staged_reward
from agent_trainer.inner_loop.run.request import KILL_FACTOR, KILL_MARGIN_S, safety_cap
from agent_trainer.inner_loop.spec.cost import CostModel, estimate_job, load_profile, machine_key
from agent_trainer.inner_loop.spec.jobspec import JobSpec

SPEC = JobSpec.model_validate({"base_model": "smollm2-135m", "algorithm": "sft", "seed": 0,
                               "hyperparameters": {"learning_rate": 1e-4, "batch_size": 16, "max_steps": 40},
                               "data": {"sources": [{"family": "calc_chain", "size": 400}]}})


def test_a_machine_profile_changes_the_wall_estimate_never_the_compute():
    here = CostModel(machine={"smollm2-135m": {"sft": 500.0}})
    compute, wall = estimate_job(SPEC, here), estimate_job(SPEC, here, wall=True)
    assert compute == estimate_job(SPEC, CostModel()), "compute is the reference machine's, everywhere"
    assert wall.step_seconds == pytest.approx(compute.step_seconds * 500.0 / 76.0, rel=1e-3)
    assert compute.stages == [(compute.step_seconds, 0.0)]


def test_the_budget_guard_counts_compute_and_ignores_the_clock():
    from agent_trainer.inner_loop.train.callbacks import BudgetGuard

    guard = BudgetGuard(100, max_compute=1.0, step_compute=0.3)
    guard.on_train_begin(None, None, None)
    guard.t0 = time.monotonic() - 3600          # an hour "passed": a busy machine changes nothing
    stops = []
    for step in range(1, 6):
        control = SimpleNamespace(should_training_stop=False)
        guard.on_step_end(None, SimpleNamespace(global_step=step), control)
        stops.append(control.should_training_stop)
    assert stops[:3] == [False, False, True] and guard.stop_reason == "timeout", "3 steps of 0.3 fit in 1.0"
    assert "compute budget" in guard.detail
    free = BudgetGuard(100)                     # no compute cap: steps only
    control = SimpleNamespace(should_training_stop=False)
    free.on_step_end(None, SimpleNamespace(global_step=99), control)
    assert not control.should_training_stop and free.stop_reason is None


def test_stages_share_the_compute_left_by_their_shares_and_pay_their_sampling_from_it():
    from agent_trainer.inner_loop.train.stages import JobBudget

    budget = JobBudget(max_steps=100, max_compute=90.0, stage_costs=[(0.5, 10.0), (1.0, 0.0)])
    first = budget.stage(0, shares=[2.0, 1.0])
    assert (first.steps, first.compute) == (100, 50.0), "2/3 of 90, less its 10 s of sampling"
    assert budget.planned_steps(later_steps=80, running=40) == 100, "the later stages get what steps are left"
    budget.spend(first, steps=40)                # 10 s sampling + 40 x 0.5
    second = budget.stage(1, shares=[2.0, 1.0])
    assert (second.steps, second.compute, second.step_compute) == (60, 60.0, 1.0), "all of the 60 s left"
    budget.spend(second, steps=60)
    assert budget.stage(1, shares=[2.0, 1.0]).steps == 0 and budget.planned_steps(later_steps=5) == 100
    assert JobBudget(max_steps=10).stage(0, shares=[1.0]).compute is None, "no compute cap: steps only"


def test_the_safety_cap_is_a_multiple_plus_a_floor_well_above_the_estimate():
    assert safety_cap(30.0) == KILL_FACTOR * 30.0 + KILL_MARGIN_S
    assert safety_cap(30.0) >= 4 * 30.0 and safety_cap(0.0) >= 120.0


def test_the_speed_stage_reads_compute_and_an_infrastructure_fault_is_excluded():
    from agent_trainer.inner_loop.run.result import STATUSES, JobResult

    def result(train_seconds: float, status: str = "ok") -> JobResult:
        return JobResult(status=status, task="t", family="calc_chain", job_dir="j", output_dir="o", job_hash="h",
                         hidden_score=0.3, baseline=0.1,
                         seconds={"train": train_seconds, "train_estimated": 12.5, "total": train_seconds})

    quiet, busy = (staged_reward(0, result(t).outcome(90.0)) for t in (4.0, 290.0))
    assert quiet == busy and quiet.speed == pytest.approx(1 - 12.5 / 90.0)
    killed = staged_reward(0, result(0.0, "infra_timeout").outcome(90.0))
    assert "infra_timeout" in STATUSES
    assert killed.excluded and killed.total == 0.0 and killed.to_dict()["excluded"] is True
    assert not staged_reward(0, JobOutcome(status="timeout", post_score=0.3, baseline=0.1)).excluded


def test_the_training_command_line_carries_the_compute_budget(tmp_path):
    from agent_trainer.inner_loop.run.worker import Training

    t = Training(tmp_path / "job", tmp_path / "model", "calc_chain", tmp_path / "out", max_steps=40,
                 max_compute=75.0, stage_costs=((0.3, 2.0),), threads=1)
    argv = t.argv()
    assert argv[argv.index("--max-compute") + 1] == "75.0" and argv[argv.index("--stage-costs") + 1] == "[[0.3, 2.0]]"
    assert t.kwargs()["stage_costs"] == [[0.3, 2.0]] and t.job_dir.is_absolute()


def test_rows_are_priced_per_token_and_reference_rows_as_before():
    from agent_trainer.inner_loop.spec.cost import REF_ROW_TOKENS, CostModel, RowTokens, estimate_cost, row_tokens

    spec = JobSpec.model_validate({"base_model": "tiny-s", "algorithm": "sft", "seed": 0,
                                   "hyperparameters": {"learning_rate": 1e-3, "batch_size": 64, "max_steps": 10},
                                   "data": {"sources": [{"family": "calc_chain", "size": 400}]}})
    short = row_tokens([{"prompt": "calc: 3+4=", "answer": "7"}])
    long = row_tokens([{"prompt": "word: Eli buys 7 bags of 4 shells. How many shells in all? =", "answer": "28"}])
    assert short.row < REF_ROW_TOKENS < long.row and row_tokens([]) == RowTokens()
    ref, longer = estimate_cost(spec).step_seconds, estimate_cost(spec, tokens=long).step_seconds
    c = CostModel()
    assert ref == estimate_cost(spec, tokens=RowTokens()).step_seconds == pytest.approx(
        round(c.sft_step_s + 64 * c.sft_sequence_s, 5))
    # measured (CPU seconds, one thread): word_math rows (38 tokens) cost 2.2x calc_chain's (10) a step
    assert 1.5 < longer / ref < 3.0 and estimate_cost(spec, tokens=short).step_seconds < ref


def test_a_calibration_on_a_busy_machine_says_so():
    """Calibration times the wall clock (it prices the safety cap and dollars); a job that got a fraction of
    the CPU measured the machine's load, and at-models says so instead of storing it silently."""
    from agent_trainer.inner_loop.spec.calibrate import busy_warning

    alone = {"sft": {"cpu_share": 1.9}, "grpo": {"cpu_share": 1.2}}
    assert busy_warning(alone) is None
    shared = {"sft": {"cpu_share": 0.12}, "grpo": {"cpu_share": 1.2}, "sft:chat": {"cpu_share": 0.3}}
    line = busy_warning(shared)
    assert line and "busy" in line and "sft 0.12" in line and "sft:chat 0.30" in line and "grpo" not in line
    assert busy_warning(shared, device="cuda") is None, "a GPU job's CPU time says nothing of its speed"


def test_calibration_separates_a_steps_fixed_cost_from_its_rows():
    """Two timed batch sizes give a factor for a step's fixed cost and one for its rows: a machine 2x the
    reference on the fixed part and 3x on the rows is read back, and prices a third batch size right; timings
    that do not separate (the larger job no slower) give one factor, the larger job's."""
    from agent_trainer.inner_loop.spec.calibrate import fit_factors
    from agent_trainer.inner_loop.spec.cost import estimate_cost

    ref = CostModel()
    small = (0.0126, 16 * 0.00079, 2 * 0.0126 + 3 * 16 * 0.00079)
    large = (0.0126, 64 * 0.00079, 2 * 0.0126 + 3 * 64 * 0.00079)
    assert fit_factors(small, large) == (2.0, 3.0)
    machine = CostModel(machine={"tiny-s": {"sft": 2.0, "sft/row": 3.0}})
    spec = JobSpec.model_validate({"base_model": "tiny-s", "algorithm": "sft", "seed": 0,
                                   "hyperparameters": {"learning_rate": 1e-4, "batch_size": 128, "max_steps": 10},
                                   "data": {"sources": [{"family": "calc_chain", "seed": 1, "size": 2000}]}},
                                  context={"task_family": "calc_chain"})
    wall = estimate_cost(spec, machine, wall=True)
    assert wall.step_seconds == pytest.approx(2 * 0.0126 + 3 * 128 * 0.00079, rel=1e-3)
    assert "x2 a step, x3 a row" in wall.formula
    assert estimate_cost(spec, machine).seconds == estimate_cost(spec, ref).seconds, "compute ignores the machine"
    one = small[2] / (0.0126 + 64 * 0.00079)
    assert fit_factors(small, (0.0126, 64 * 0.00079, small[2])) == (pytest.approx(one, rel=1e-3),) * 2
    # SmolLM2's chat SFT here: 16.65 s a step at batch 16, 74.2 s at 64 (4.45x for 4x the rows): its step is all
    # rows, so the rows take the whole price and both batch sizes come back within 11%, not the one factor's 1.8x.
    fixed, per_row = fit_factors((0.0126, 16 * 0.00079, 16.65), (0.0126, 64 * 0.00079, 74.2))
    assert fixed == 0.01 and per_row == pytest.approx(1458, rel=0.01)
    for rows, measured in ((16, 16.65), (64, 74.2)):
        assert fixed * 0.0126 + per_row * rows * 0.00079 == pytest.approx(measured, rel=0.11)


def test_a_floored_factor_stays_below_a_fast_machines_own():
    """A machine 250x the reference (a GPU) whose small job came out so fast that its fixed part fits negative:
    the floored fixed factor is 1% of its row factor, not the CPU's 0.01 (2.5x what a step's fixed part costs
    there), and both timings come back as closely as on the CPU; likewise a GRPO part that cost nothing."""
    from agent_trainer.inner_loop.spec import calibrate as cal

    small, large = (0.0126, 16 * 0.00079, 16 * 0.00079 / 250), (0.0126, 64 * 0.00079, 64 * 0.00079 * 1.1 / 250)
    fixed, per_row = cal.fit_factors(small, large)
    assert per_row == pytest.approx(0.0043, rel=0.03) and fixed == pytest.approx(per_row / 100, rel=0.01)
    for f, r, m in (small, large):
        assert fixed * f + per_row * r == pytest.approx(m, rel=0.11)
    assert cal.fit_part_factor((0.05, 1.0, 1.05 / 250), (0.05, 2.0, 1.0 / 250)) == pytest.approx(4e-5)
    # On a machine at or below the reference's speed the floor is the fixed 0.01, as before
    assert cal.floor_for(1458) == cal.floor_for(1.0) == cal.FIXED_FLOOR == 0.01
    assert cal.floor_for(0.5) == 0.005 and cal.floor_for(0.0) == cal.FIXED_FLOOR


def _grpo_machine(a: float, c: float, d: float, e: float):
    """A fake calibration timer for a machine whose GRPO step costs ``a + batch x (c + d x completion tokens + e x
    prompt tokens)`` seconds (SFT and DPO: a flat 0.05 + 0.01 a row); the jobs it timed are listed in ``ran``."""
    from agent_trainer.inner_loop.spec import calibrate as cal
    from agent_trainer.inner_loop.spec.cost import row_tokens

    ran = []

    def timed(name, model_dir, job, device, folder, fmt=None, threads=None, family="calc_chain", pad=""):
        hp = job["hyperparameters"]
        ran.append((job["algorithm"], fmt.kind, hp["batch_size"], hp.get("max_completion_length"), bool(pad)))
        if job["algorithm"] == "grpo":
            prompt = row_tokens(cal._rows(job, family, pad)).prompt
            return a + hp["batch_size"] * (c + d * hp["max_completion_length"] + e * prompt), 4, 1.9, 0.0
        return 0.05 + 0.01 * hp["batch_size"], 5, 1.9, 0.0

    return timed, ran


def _grpo_spec(batch: int, tokens: int, family: str = "calc_chain") -> JobSpec:
    return JobSpec.model_validate({"base_model": "tiny-s", "algorithm": "grpo", "seed": 0, "peft": {"r": 8},
                                   "hyperparameters": {"learning_rate": 1e-5, "batch_size": batch,
                                                       "num_generations": 4, "max_completion_length": tokens,
                                                       "max_steps": 10},
                                   "reward": {"functions": [{"name": "numeric_closeness"}]},
                                   "data": {"sources": [{"family": family, "seed": 1, "size": 400}]}},
                                  context={"task_family": family})


def test_grpo_calibrated_on_its_completions_and_prompts_prices_each_apart(tmp_path, monkeypatch):
    """GRPO is timed at two batch sizes, at 4x the completion tokens and with longer prompts: a machine whose
    completion costs mostly what does not grow with its length, and whose prompt tokens cost a tenth of a
    completion token (SmolLM2 here: sampling is token by token, a prompt runs at once) is read back, and prices
    completions shorter and longer than the calibration's (up to its longer job's), after longer prompts, within 2%,
    where the two-point profile (the reference's shape) misses by more than 1.5x; the compute (the budget's unit)
    does not move."""
    from agent_trainer.inner_loop.spec import calibrate as cal
    from agent_trainer.inner_loop.spec.cost import estimate_cost, row_tokens
    from agent_trainer.inner_loop.train.data import build_rows_with_origins

    a, c, d, e = 0.4, 0.05, 0.002, 0.0002
    timed, ran = _grpo_machine(a, c, d, e)
    monkeypatch.setattr(cal, "_timed_job", timed)
    factors = cal.calibrate("tiny-s", cache_dir=tmp_path, progress=False, algorithms=["grpo"],
                            formats=["raw"])["factors"]
    assert ran == [("grpo", "raw", 16, 8, False), ("grpo", "raw", 64, 8, False), ("grpo", "raw", 16, 32, False),
                   ("grpo", "raw", 16, 8, True)]
    assert set(factors) == {"grpo", "grpo/row", "grpo/token", "grpo/prompt"}
    assert factors["grpo/prompt"] < factors["grpo/token"] / 5 < factors["grpo/row"]
    machine = CostModel.measured("cpu", tmp_path)
    two_point = CostModel(machine={"tiny-s": {k: factors[k] for k in ("grpo", "grpo/row")}})
    for batch, tokens, family in ((32, 2, "calc_chain"), (32, 4, "count_char"), (128, 5, "sort_numbers"),
                                  (16, 24, "reverse_text")):
        spec = _grpo_spec(batch, tokens, family)
        rows = row_tokens(build_rows_with_origins(spec, None, family)[0])
        true = a + batch * (c + d * tokens + e * rows.prompt)
        assert estimate_cost(spec, machine, wall=True, tokens=rows).step_seconds == pytest.approx(true, rel=0.02)
        compute = estimate_cost(spec, machine, tokens=rows).seconds
        assert compute == estimate_cost(spec, CostModel(), tokens=rows).seconds
    # Beyond the longer calibration's 32 tokens (not measured: a model that stopped early on calc_chain may not on
    # a job's rows), a token costs no less than the row factor says: the safety cap errs high.
    long = _grpo_spec(16, 128)
    assert estimate_cost(long, machine, wall=True).step_seconds > 1.5 * (a + 16 * (c + 128 * d + e * 8.6))
    short = estimate_cost(_grpo_spec(32, 2), two_point, wall=True).step_seconds
    assert not 1 / 1.5 < short / (a + 32 * (c + 2 * d + e * 8.6)) < 1.5, "the two-point shape misses short ones"
    assert "a completion of 8 tokens" in estimate_cost(_grpo_spec(32, 4), machine, wall=True).formula
    # Longer completions no slower (noise): the tokens cost next to nothing, never a negative price.
    assert cal.fit_part_factor((0.05, 1.0, 9.0), (0.05, 2.0, 8.5)) == cal.FIXED_FLOOR


def test_calibrate_missing_only_times_what_the_stored_profile_lacks(tmp_path, monkeypatch):
    """A profile stored before GRPO's extra jobs existed prices as it did; ``missing_only`` times those jobs alone
    and fits them with the stored seconds, giving the factors a whole calibration gives; refit of the old profile
    keeps its two factors (no part factor without the seconds for one)."""
    import json

    from agent_trainer.inner_loop.spec import calibrate as cal
    from agent_trainer.inner_loop.spec.cost import PROFILE_FILE

    timed, ran = _grpo_machine(0.4, 0.05, 0.002, 0.0002)
    monkeypatch.setattr(cal, "_timed_job", timed)
    whole = cal.calibrate("tiny-s", cache_dir=tmp_path, progress=False, formats=["raw"])["factors"]
    path = tmp_path / PROFILE_FILE
    data = json.loads(path.read_text())
    stored = data[machine_key("cpu")]["tiny-s"]
    for part in ("factors", "measured"):
        for key in ("grpo/token", "grpo/prompt"):
            stored[part].pop(key)
    path.write_text(json.dumps(data))
    assert not {"grpo/token", "grpo/prompt"} & set(cal.refit("tiny-s", cache_dir=tmp_path)["factors"])
    ran.clear()
    again = cal.calibrate("tiny-s", cache_dir=tmp_path, progress=False, formats=["raw"], missing_only=True)
    assert ran == [("grpo", "raw", 16, 32, False), ("grpo", "raw", 16, 8, True)]
    assert again["factors"] == whole and load_profile(machine_key("cpu"), tmp_path)["tiny-s"] == whole
    assert again["measured"]["sft"]["batch_size"] == 16, "what was reused is reported as measured"
    assert again["measured"]["grpo/prompt"]["longer_prompts"] and "longer_prompts" not in again["measured"]["grpo"]


def test_a_calibration_that_cannot_finish_keeps_what_it_measured(tmp_path, monkeypatch):
    """A calibration job that dies (a large model out of memory at DPO's larger batch) ends in one line that says
    which job and what is stored; the factors measured before it are in the profile, beside an earlier
    calibration's others."""
    from agent_trainer.inner_loop.spec import calibrate as cal
    from agent_trainer.inner_loop.spec.cost import load_profile, machine_key, save_profile

    save_profile(machine_key("cpu"), "tiny-s", {"sample": 0.7, "sft": 9.0}, {}, tmp_path)

    def timed(name, model_dir, job, device, folder, fmt=None, threads=None, family="calc_chain", pad=""):
        if job["algorithm"] == "dpo":
            raise cal.CalibrationError("the calibration job (dpo, raw format, batch 16) ended crashed: killed")
        return 0.05 * (1 + job["hyperparameters"]["batch_size"] / 16), 5, 1.0, 0.0

    monkeypatch.setattr(cal, "_timed_job", timed)
    with pytest.raises(cal.CalibrationError, match=r"\(dpo, raw format, batch 16\).*stored \(sft, sft/row, grpo, "):
        cal.calibrate("tiny-s", cache_dir=tmp_path, progress=False)
    stored = load_profile(machine_key("cpu"), tmp_path)["tiny-s"]
    assert {"sft", "sft/row", "grpo", "grpo/row", "sample"} <= set(stored) and "dpo" not in stored
    assert stored["sft"] != 9.0 and stored["sample"] == 0.7, "new measurements replace old ones, the rest is kept"


def test_a_calibration_of_some_algorithms_and_formats_measures_those_only(tmp_path, monkeypatch):
    """``algorithms`` and ``formats`` pick what a calibration times (a large model's 40 minutes cut to the jobs a
    user runs); a chat format asked of a model without a chat template is one line, not a traceback."""
    from agent_trainer.inner_loop.spec import calibrate as cal

    ran = []

    def timed(name, model_dir, job, device, folder, fmt=None, threads=None, family="calc_chain", pad=""):
        ran.append((job["algorithm"], fmt.kind, job["hyperparameters"]["batch_size"]))
        return 0.05 * (1 + job["hyperparameters"]["batch_size"] / 16), 5, 1.0, 0.0

    monkeypatch.setattr(cal, "_timed_job", timed)
    profile = cal.calibrate("tiny-s", cache_dir=tmp_path, progress=False, algorithms=["sft"], formats=["chat"])
    assert ran == [("sft", "chat", 16), ("sft", "chat", 64)]
    assert set(profile["factors"]) == {"sft:chat", "sft:chat/row"}
    import json
    import shutil

    from agent_trainer.inner_loop.models.registry import resolve_model
    from agent_trainer.registry import BASE_MODELS_ENV

    plain = tmp_path / "plain"   # a model folder whose tokenizer has no chat template
    shutil.copytree(resolve_model("tiny-s"), plain, ignore=shutil.ignore_patterns("chat_template.jinja"))
    monkeypatch.setenv(BASE_MODELS_ENV, json.dumps({"plain": {"path": str(plain)}}))
    with pytest.raises(cal.CalibrationError, match="no chat template: calibrate it with formats=\\[raw\\]"):
        cal.calibrate("plain", cache_dir=tmp_path, progress=False, formats=["chat"])


def test_refit_gives_a_calibrations_factors_from_its_stored_seconds_alone(tmp_path, monkeypatch):
    """``at-models calibrate refit=true`` fits the stored seconds again without running a job: on an unchanged fit
    it gives back the calibration's factors (the sampling's too); a model never calibrated is one line."""
    from agent_trainer.inner_loop.spec import calibrate as cal

    def timed(name, model_dir, job, device, folder, fmt=None, threads=None, family="calc_chain", pad=""):
        hp = job["hyperparameters"]
        return 0.02 + 0.004 * hp["batch_size"] * (3 if fmt.kind == "chat" else 1), 5, 1.9, 0.1 * hp["batch_size"]

    monkeypatch.setattr(cal, "_timed_job", timed)
    measured = cal.calibrate("tiny-s", cache_dir=tmp_path, progress=False)["factors"]
    monkeypatch.setattr(cal, "_timed_job", None)   # refit must not time anything
    assert cal.refit("tiny-s", cache_dir=tmp_path)["factors"] == pytest.approx(measured, abs=0.011)
    assert load_profile(machine_key("cpu"), tmp_path)["tiny-s"] == pytest.approx(measured, abs=0.011)
    with pytest.raises(cal.CalibrationError, match="no cost profile of tiny-m .*at-models calibrate model=tiny-m"):
        cal.refit("tiny-m", cache_dir=tmp_path)


def test_refit_and_missing_only_together_are_refused_before_anything_runs(tmp_path, monkeypatch):
    """The two ask for different things (fit the stored seconds, no job; time the missing jobs): at-models says so
    in one line instead of silently doing the first."""
    from agent_trainer.commands import models as at_models
    from agent_trainer.config import compose_config
    from agent_trainer.inner_loop.spec import calibrate as cal

    monkeypatch.setattr(cal, "refit", None)
    monkeypatch.setattr(cal, "calibrate", None)
    cfg = compose_config([f"runs_dir={tmp_path}", "run_id=cal", f"cache_dir={tmp_path}", "action=calibrate",
                          "refit=true", "missing_only=true", "tracking=off"], "models")
    with pytest.raises(cal.CalibrationError, match="give one of them"):
        at_models.run(cfg)


def test_what_the_agent_reads_of_a_job_is_its_compute_not_the_clock():
    """A job result's agent view (and its text in the conversation) gives the compute of what ran and the
    validation's dollars: the same job on a loaded machine (more seconds, more measured dollars) reads the same."""
    from agent_trainer.inner_loop.run.result import JobResult
    from agent_trainer.outer_loop.episode.tools import _job_text

    def result(train: float, total: float, usd: float) -> JobResult:
        return JobResult(task="t", family="calc_chain", job_dir="j", output_dir="o", job_hash="h", status="ok",
                         steps=30, planned_steps=30, estimated_usd=0.0004, usd=usd,
                         seconds={"validate": 0.1, "train": train, "process": total - 1, "eval": 1.0, "total": total,
                                  "train_estimated": 3.25})

    quiet, loaded = result(4.0, 9.0, 0.0002), result(31.0, 58.0, 0.0016)
    assert quiet.visible() == loaded.visible()
    assert _job_text(quiet.visible(), 1) == _job_text(loaded.visible(), 1)
    assert "compute: 3.2 s training" in _job_text(loaded.visible(), 1) and "$0.0004" in _job_text(loaded.visible(), 1)


def _variant(spec: JobSpec, **changes) -> JobSpec:
    return JobSpec.model_validate({**spec.model_dump(), **changes})


@pytest.mark.parametrize("model", [{}, {"machine": {"smollm2-135m": {"grpo": 90.0}}}])
def test_a_large_lora_rank_and_grpos_reference_model_are_charged(model):
    """Settings that make a step dearer cost more compute (bench/cost_model.py --variants times them); an agent
    choosing them is charged, not given the compute free. Ranks at or under the calibrated one, and beta 0, are
    priced as ever."""
    cost = CostModel(**model)
    lora = _variant(SPEC, peft={"r": 16, "alpha": 32})
    est = lambda spec: estimate_job(spec, cost, wall=bool(model))   # noqa: E731
    r256 = est(_variant(lora, peft={"r": 256, "alpha": 32}))
    assert r256.step_seconds == pytest.approx(est(lora).step_seconds * (1 + cost.lora_rank_s * 240), rel=1e-3)
    assert "rank 256" in r256.formula
    assert est(_variant(lora, peft={"r": 8, "alpha": 16})).step_seconds == est(lora).step_seconds
    grpo = _grpo_spec(32, 4)
    grpo = _variant(grpo, base_model="smollm2-135m")
    kl = _variant(grpo, hyperparameters={**grpo.hyperparameters.model_dump(), "beta": 0.1})
    assert est(kl).step_seconds == pytest.approx(est(grpo).step_seconds * cost.grpo_kl_factor, rel=1e-3)
    assert "KL reference" in est(kl).formula and "KL reference" not in est(grpo).formula


def test_the_estimate_of_a_job_without_those_settings_is_unchanged():
    """The agent reads the estimate's formula in its validation (and the compute enters its reward): a job at the
    calibrated rank and beta 0 gets the same numbers and words as before these settings were priced."""
    lora = estimate_job(_variant(SPEC, peft={"r": 16, "alpha": 32}), CostModel())
    assert lora.formula == "sft, batch 16, smollm2-135m x76, lora x0.9, $0.1/h"
    assert lora.step_seconds == round((0.0126 + 16 * 0.00079) * (76 * 0.9), 5)


def test_reward_code_past_its_time_ends_the_job_as_its_own_timeout(monkeypatch):
    """A reward slow on purpose (it sleeps; each call inside the per-call timeout) stops the training as the job's
    ``timeout`` once the reward host's answers took more than their limit together, before the wall-clock
    safety cap could make it an ``infra_timeout`` (excluded, retried: free for the agent)."""
    from agent_trainer.inner_loop.train.callbacks import AGENT_TIME, BudgetGuard, agent_time_limit

    clock = [0.0]
    monkeypatch.setattr(AGENT_TIME, "spent", lambda: clock[0])
    monkeypatch.setattr(AGENT_TIME, "limit", agent_time_limit(45.0))
    assert AGENT_TIME.limit == 105.0 and agent_time_limit(45.0) < safety_cap(45.0)
    guard = BudgetGuard(100, max_compute=45.0, step_compute=0.1)
    guard.on_train_begin(None, None, None)
    stops = []
    for step in range(1, 41):
        clock[0] += 4.0   # a reward that sleeps 4 s a call
        control = SimpleNamespace(should_training_stop=False)
        guard.on_step_end(None, SimpleNamespace(global_step=step), control)
        stops.append(control.should_training_stop)
    assert stops.index(True) == 26 and guard.stop_reason == "timeout", "27 x 4 s > 105 s"
    assert "reward functions took 108 s by step 27" in guard.detail


def test_the_reward_channel_counts_the_hosts_time():
    import socket
    import threading

    from agent_trainer.inner_loop.isolation.reward_host import recv, send
    from agent_trainer.inner_loop.isolation.reward_proxy import RewardChannel

    ours, host = socket.socketpair()

    def answer():
        while (req := recv(host)) is not None:
            time.sleep(0.2)
            send(host, {"ok": True, "names": ["f"]} if req.get("op") == "load" else {"values": [0.0]})

    threading.Thread(target=answer, daemon=True).start()
    channel = RewardChannel(ours, timeout_s=5)
    for _ in range(3):
        channel.ask({"op": "call"}, "reward 'f'")
    assert 0.55 < channel.seconds < 2.0
    ours.close()


def test_a_dpo_data_files_pairs_are_priced_by_the_text_trained_and_long_rows_at_the_trainers_cut():
    """DPO trains ``prompt + chosen`` and ``prompt + rejected``, never ``answer``: pairs of ~1,000 tokens behind
    one-token answers had been priced as one-token rows (a red-team job ran 58 s of training priced at 1 s). A
    sequence counts at most ``MAX_SEQUENCE_TOKENS``, where every trainer cuts it."""
    from agent_trainer.inner_loop.spec.cost import MAX_SEQUENCE_TOKENS, estimate_cost, row_tokens

    long_text = " ".join(f"count a in banana{i}? 3" for i in range(300))
    pair = {"prompt": "count a in banana? ", "answer": "3", "chosen": "3 " + long_text, "rejected": "2"}
    as_sft, as_dpo = row_tokens([pair]), row_tokens([pair], pairs=True)
    assert as_sft.row < 20 and as_dpo.row == MAX_SEQUENCE_TOKENS and as_sft.prompt == as_dpo.prompt
    short = row_tokens([{**pair, "chosen": "3", "rejected": "2"}], pairs=True)
    assert short.row == as_sft.row, "a pair as long as the answer costs what the answer did"
    spec = JobSpec.model_validate({"base_model": "tiny-s", "algorithm": "dpo", "seed": 0,
                                   "hyperparameters": {"learning_rate": 5e-4, "batch_size": 32, "max_steps": 8,
                                                       "beta": 0.5}, "data": {"file": "data.jsonl"}})
    assert estimate_cost(spec, tokens=as_dpo).step_seconds > 5 * estimate_cost(spec, tokens=as_sft).step_seconds
