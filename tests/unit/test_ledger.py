"""Cost ledger: prices, running totals, caps checked before spending, resume, torn lines, SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields

import pytest

from agent_trainer.config import BudgetConfig
from agent_trainer.outer_loop.episode.ledger import (
    BudgetExhausted, Estimate, Ledger, LedgerCorrupt, Prices, read_records,
)

PRICES = Prices(llm={"big": (2.0, 8.0)}, default_llm=(0.0, 0.0), job_usd_per_hour={"cpu": 0.36})


def caps(**given) -> BudgetConfig:
    """The budget group with only the ``given`` caps (every other one None: no cap)."""
    return BudgetConfig(**{**{f.name: None for f in fields(BudgetConfig)}, **given})


def test_records_price_and_running_totals(tmp_path):
    with Ledger.open(tmp_path, prices=PRICES) as led:
        a = led.record_llm(episode="e0", model="big", tokens_in=1_000_000, tokens_out=500_000)
        b = led.record_job(episode="e1", device="cpu", seconds=100.0, status="ok")
        c = led.record_llm(episode="e1", model="local-tiny", tokens_in=10, tokens_out=5)
    assert a["usd"] == pytest.approx(2.0 + 4.0)
    assert b["usd"] == pytest.approx(0.01)  # 100 s at $0.36 per hour
    assert c["usd"] == 0.0
    assert c["run_totals"]["usd"] == pytest.approx(6.01)
    assert c["run_totals"]["tokens_in"] == 1_000_010 and c["run_totals"]["jobs"] == 1
    assert c["episode_totals"] == {**c["episode_totals"], "jobs": 1, "llm_calls": 1, "tokens_out": 5}
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == [0, 1, 2]


def test_jobs_are_charged_their_compute_so_a_slow_machine_spends_a_budget_no_sooner(tmp_path):
    """The caps count a job's charged compute (its estimate); its measured seconds are priced beside, so the same
    jobs on a loaded machine leave the same totals for the caps and are admitted or refused alike."""
    from functools import partial

    from agent_trainer.inner_loop.run.result import JobResult

    job = partial(JobResult, task="t", family="f", job_dir="j", output_dir="o", job_hash="h")
    quiet = job(status="ok", seconds={"total": 40.0, "estimated": 30.0})
    loaded = job(status="ok", seconds={"total": 400.0, "estimated": 30.0})
    assert quiet.charged_seconds == loaded.charged_seconds == 30.0
    assert job(status="invalid", seconds={"total": 3.0}).charged_seconds == 0.0
    assert job(status="ok", seconds={"total": 12.0}).charged_seconds == 12.0   # no estimate: measured
    budget = caps(max_usd_per_episode=0.007)   # two jobs of 30 s at $0.36/h ($0.003 each), not three
    for name, result in (("quiet", quiet), ("loaded", loaded)):
        with Ledger.open(tmp_path / name, prices=PRICES, budget=budget) as led:
            for _ in range(2):
                led.check("job", Estimate(usd=PRICES.job_usd("cpu", 30.0), jobs=1), episode="e0")
                rec = led.record_job(episode="e0", device="cpu", seconds=result.seconds["total"],
                                     charged_seconds=result.charged_seconds, status="ok")
            with pytest.raises(BudgetExhausted, match="max_usd_per_episode"):
                led.check("job", Estimate(usd=PRICES.job_usd("cpu", 30.0), jobs=1), episode="e0")
            assert rec["usd"] == pytest.approx(0.003) and rec["charged_seconds"] == 30.0
            assert rec["episode_totals"]["usd"] == pytest.approx(0.006)
            assert rec["usd_measured"] == pytest.approx(result.seconds["total"] / 3600 * 0.36)
            assert rec["run_totals"]["usd_measured"] == pytest.approx(2 * rec["usd_measured"])
    # a record written without a charge (an older ledger, or a caller that has none): the measured seconds
    with Ledger.open(tmp_path / "plain", prices=PRICES) as led:
        rec = led.record_job(episode="e0", device="cpu", seconds=100.0)
    assert rec["usd"] == rec["usd_measured"] == pytest.approx(0.01) and rec["charged_seconds"] == 100.0


def test_reopen_restores_totals_and_keeps_counting(tmp_path):
    with Ledger.open(tmp_path, prices=PRICES) as led:
        led.record_llm(episode="e0", model="big", tokens_in=300, tokens_out=200)
        led.record_job(episode="e0", device="cpu", seconds=10)
        before = led.run_totals()
    with Ledger.open(tmp_path, prices=PRICES, budget=caps(max_jobs_per_episode=1)) as led:
        assert led.run_totals() == before
        assert led.episode_totals("e0").jobs == 1
        with pytest.raises(BudgetExhausted, match="budget.max_jobs_per_episode"):
            led.check("job", episode="e0")
        led.check("job", episode="e1")  # another episode still may
        rec = led.record_llm(episode="e0", model="big", tokens_in=1, tokens_out=1)
    assert rec["seq"] == 2 and rec["run_totals"]["llm_calls"] == 2


def test_cap_is_never_exceeded_by_more_than_one_call(tmp_path):
    cap = 0.05
    led = Ledger.open(tmp_path, prices=PRICES, budget=caps(max_usd_per_run=cap))
    calls, biggest = 0, 0.0
    for i in range(10_000):
        tokens_in, tokens_out = 500 + 37 * (i % 11), 50 + 97 * (i % 7)
        try:
            # Underestimate on purpose (output guessed at 10 tokens): the cap may then be crossed once.
            led.check("llm", led.estimate_llm("big", tokens_in, 10), episode="e0")
        except BudgetExhausted as e:
            assert "budget.max_usd_per_run" in str(e) and "spent" in str(e)
            break
        rec = led.record_llm(episode="e0", model="big", tokens_in=tokens_in, tokens_out=tokens_out)
        calls, biggest = calls + 1, max(biggest, rec["usd"])
    else:
        pytest.fail("the cap never stopped the calls")
    spent = led.run_totals().usd
    assert calls > 5 and cap < spent <= cap + biggest
    # With honest estimates (max_new_tokens as the bound) the cap is never crossed at all.
    led2 = Ledger(tmp_path / "honest.jsonl", prices=PRICES, budget=caps(max_usd_per_run=cap))
    while True:
        try:
            led2.check("llm", led2.estimate_llm("big", 700, 700))
        except BudgetExhausted:
            break
        led2.record_llm(episode="e0", model="big", tokens_in=700, tokens_out=650)
    assert 0 < led2.run_totals().usd <= cap


def test_token_and_job_caps_are_separate(tmp_path):
    led = Ledger.open(tmp_path, budget=caps(max_tokens_per_episode=100, max_jobs_per_episode=1))
    led.record_job(episode="e0", device="cpu", seconds=1)
    with pytest.raises(BudgetExhausted, match="max_jobs_per_episode"):
        led.check("job", episode="e0")
    led.check("llm", Estimate(tokens=100), episode="e0")  # a spent job cap does not stop talking
    led.record_llm(episode="e0", model="m", tokens_in=90, tokens_out=10)
    with pytest.raises(BudgetExhausted, match="max_tokens_per_episode"):
        led.check("llm", Estimate(tokens=1), episode="e0")
    with pytest.raises(ValueError, match="kind"):
        led.check("gpu")


def test_torn_last_line_is_dropped_on_reopen(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with Ledger(path, prices=PRICES) as led:
        led.record_llm(episode="e0", model="big", tokens_in=100, tokens_out=100)
        led.record_llm(episode="e0", model="big", tokens_in=100, tokens_out=100)
    good = path.read_bytes()
    path.write_bytes(good + b'{"kind": "llm", "episode": "e0", "usd": 99, "tok')  # killed mid-write
    with Ledger(path, prices=PRICES) as led:
        assert led.run_totals().llm_calls == 2 and led.run_totals().usd < 1
        assert path.read_bytes() == good  # truncated back to the last full record
        led.record_job(episode="e0", device="cpu", seconds=1)
    assert [r["kind"] for r in map(json.loads, path.read_text().splitlines())] == ["llm", "llm", "job"]


def test_damage_before_the_last_line_is_an_error(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with Ledger(path) as led:
        led.record_llm(episode="e0", model="m", tokens_in=1, tokens_out=1)
        led.record_llm(episode="e0", model="m", tokens_in=1, tokens_out=1)
    lines = path.read_text().splitlines()
    path.write_text("{not json\n" + lines[1] + "\n")
    with pytest.raises(LedgerCorrupt, match="does not parse"):
        Ledger(path)


def test_two_writers_share_one_ledger(tmp_path):
    a, b = Ledger.open(tmp_path), Ledger.open(tmp_path)
    a.record_llm(episode="e0", model="m", tokens_in=5, tokens_out=5)
    rec = b.record_llm(episode="e1", model="m", tokens_in=1, tokens_out=1)
    assert rec["run_totals"]["llm_calls"] == 2 and rec["seq"] == 1  # b folded in a's record first
    assert a.run_totals().tokens == 12


_CHILD = """
import sys
from agent_trainer.outer_loop.episode.ledger import Ledger, Prices
led = Ledger(sys.argv[1], prices=Prices(default_llm=(1.0, 3.0), default_job_usd_per_hour=1.0))
i = 0
while True:
    if i % 5 == 4:
        led.record_job(episode=f"e{i % 3}", device="cpu", seconds=0.5 + i, note="x" * (i % 200))
    else:
        led.record_llm(episode=f"e{i % 3}", model="m", tokens_in=100 + i, tokens_out=i, note="y" * (i % 300))
    i += 1
"""


def test_sigkill_while_appending_leaves_a_consistent_ledger(tmp_path):
    path = tmp_path / "ledger.jsonl"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists() and path.read_bytes().count(b"\n") >= 200:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the child wrote fewer than 200 records in 60 s")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    with Ledger(path) as led:  # repairs a torn tail if the kill hit mid-write
        totals = led.run_totals()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # ends on a complete record
    records = [json.loads(x) for x in lines[:-1]]  # every line parses
    assert records == read_records(path)
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert totals.llm_calls + totals.jobs == len(records)
    assert totals.usd == pytest.approx(sum(r["usd"] for r in records))
    assert totals.tokens_in == sum(r.get("tokens_in", 0) for r in records)
    assert records[-1]["run_totals"]["usd"] == pytest.approx(totals.usd)
