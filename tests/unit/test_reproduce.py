"""bench/reproduce.py: what it calls the same, and the docs' tables against its record."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("reproduce", ROOT / "bench" / "reproduce.py")
reproduce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce)
RECORD = json.loads(reproduce.RECORD.read_text())


def job(uplift: float, status: str = "ok") -> dict:
    return {"status": status, "steps": 100, "hidden_score": 0.1 + uplift, "baseline": 0.1, "uplift": uplift,
            "seconds_train": 30.0}


def test_exact_means_every_digit_and_tolerance_means_the_stated_one():
    record = {"jobs": {"a": job(0.05)}}
    assert reproduce.compare(record, {"jobs": {"a": job(0.05)}}, exact=True) == []
    moved = {"jobs": {"a": job(0.05 + 1e-9)}}
    assert reproduce.compare(record, moved, exact=True), "exact: a last-digit difference is a difference"
    assert reproduce.compare(record, moved, exact=False) == []
    assert reproduce.compare(record, {"jobs": {"a": job(0.07)}}, exact=False) == [], "0.02 is within 0.03"
    far = reproduce.compare(record, {"jobs": {"a": job(0.10)}}, exact=False)
    assert any("uplift" in d for d in far), far
    assert reproduce.compare(record, {"jobs": {"a": job(0.05, "timeout")}}, exact=False), "a status is never close"
    slower = {"jobs": {"a": {**job(0.05), "seconds_train": 300.0}}}
    assert reproduce.compare(record, slower, exact=True) == [], "timings are never compared"


def test_a_job_run_alone_is_compared_alone_and_models_are_always_exact():
    record = {"jobs": {"a": job(0.05), "b": job(0.0)}, "models": {"tiny-s": {"model.safetensors": "ab"}}}
    assert reproduce.compare(record, {"jobs": {"a": job(0.05)}}, exact=True) == []
    other = {"models": {"tiny-s": {"model.safetensors": "ac"}}}
    assert reproduce.compare(record, other, exact=False), "bytes are compared exactly on any machine"


def test_a_shorter_main_run_skips_only_its_last_steps_end_keys():
    record = {"main": {"steps": 3, "metrics": [{"step": 0, "reward_mean": 0.2, "heldout_start": 0.3},
                                               {"step": 1, "reward_mean": 0.25},
                                               {"step": 2, "reward_mean": 0.3, "training_gain": 0.1}]}}
    short = {"main": {"steps": 2, "metrics": [{"step": 0, "reward_mean": 0.2, "heldout_start": 0.3},
                                              {"step": 1, "reward_mean": 0.25, "training_gain": 0.05}]}}
    assert reproduce.compare(record, short, exact=True) == []
    short["main"]["metrics"][0].pop("heldout_start")
    assert reproduce.compare(record, short, exact=True), "a key missing from an earlier step is a difference"
    whole = {"main": {"steps": 3, "metrics": [dict(r) for r in record["main"]["metrics"]]}}
    whole["main"]["metrics"][2]["training_gain"] = 0.11
    assert reproduce.compare(record, whole, exact=True), "a run as long as the record compares its end too"
    longer = {"main": {"steps": 4, "metrics": whole["main"]["metrics"]}}
    assert reproduce.compare(record, longer, exact=False), "longer than the record: nothing to compare with"


def test_the_source_is_the_same_only_with_the_same_software_and_cpu_kind():
    here = {"software": {"torch": "2.13.0"}, "cpu": {"vendor": "AuthenticAMD", "torch_capability": "AVX2"}}
    assert reproduce.same_source(here, json.loads(json.dumps(here))) == (True, [])
    other = {"software": {"torch": "2.13.0"}, "cpu": {"vendor": "GenuineIntel", "torch_capability": "AVX512"}}
    same, why = reproduce.same_source(here, other)
    assert not same and any("vendor" in w for w in why) and any("AVX512" in w for w in why)


def test_portable_kernels_are_one_kind_whatever_the_vendor(tmp_path, monkeypatch):
    """hardware.cpu_kernels=portable: an Intel and an AMD CPU running torch's AVX2 kernels and MKL's COMPATIBLE
    branch are compared exactly, with one record (no vendor in its name); native kernels still part by vendor."""
    from agent_trainer.kernels import PORTABLE_KERNELS

    monkeypatch.setattr(reproduce, "KIND_RECORDS", tmp_path / "kinds")
    settings = {k: v for k, v in PORTABLE_KERNELS.items() if k != "ATEN_CPU_CAPABILITY"}
    amd = {"machine": "x86_64", "vendor": "AuthenticAMD", "torch_capability": "AVX2", **settings}
    intel = {**amd, "vendor": "GenuineIntel"}
    soft = {"torch": "2.13.0"}
    assert reproduce.same_source({"software": soft, "cpu": amd}, {"software": soft, "cpu": intel}) == (True, [])
    path = reproduce.kind_record_path(intel)
    assert path == reproduce.kind_record_path(amd) and "Intel" not in path.name and "COMPATIBLE" in path.name
    native = {"machine": "x86_64", "vendor": "AuthenticAMD", "torch_capability": "AVX2"}
    assert not reproduce.same_source({"software": soft, "cpu": native},
                                     {"software": soft, "cpu": {**native, "vendor": "GenuineIntel"}})[0]
    half = {**intel, "MKL_CBWR": "AVX2"}   # MKL's AVX2 branch: Intel CPUs only (MKL falls back on others)
    assert not reproduce.same_source({"software": soft, "cpu": amd}, {"software": soft, "cpu": half})[0]


KIND_RECORDS = sorted(reproduce.KIND_RECORDS.glob("*.json"))


@pytest.mark.parametrize("path", [reproduce.RECORD, *KIND_RECORDS], ids=lambda p: p.name)
def test_the_record_is_whole(path):
    """The reference record: all four parts; a kind of CPU's: the shipped bytes at least (a part the code's changes
    made stale is dropped and borrowed from the reference until it is re-made there). Every example job where jobs
    are recorded, the shipped bytes, the software the package pins, and (for a kind's record) the file named after
    the CPU it was made on."""
    record = json.loads(path.read_text())
    assert set(reproduce.PARTS if path == reproduce.RECORD else ["models"]) <= set(record), sorted(record)
    assert "borrowed" not in record, "a record holds only what was measured on its kind"
    if "jobs" in record:
        assert set(record["jobs"]) == set(reproduce.example_jobs()), "every example job has a recorded result"
    from agent_trainer.inner_loop.models.registry import shipped_models

    for name, entry in shipped_models().items():
        assert record["models"][name] == entry["files"], f"{name}: the record's bytes are the shipped ones"
    assert record["software"] == RECORD["software"], "records of other kinds of CPU are made with the same software"
    if path != reproduce.RECORD:
        assert reproduce.comparable(record["cpu"]) != reproduce.comparable(RECORD["cpu"])
        assert reproduce.kind_record_path(record["cpu"]) == path


def table_rows(doc: str, first: str) -> dict[str, list[str]]:
    """The rows of the markdown table in ``doc`` whose header starts with ``first``, by their first cell."""
    lines = (ROOT / doc).read_text().splitlines()
    out: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        if line.startswith(f"| {first}"):
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                out[cells[0]] = cells[1:]
            break
    return out


def test_docs_baselines_are_the_records():
    rows = table_rows("docs/baselines.md", "family")
    for family, score in RECORD["baselines"]["tiny-s"].items():
        key = f"{family} (held out)" if family == "triage" else family
        assert rows[key] == [f"{score:.3f}", f"{RECORD['baselines']['tiny-m'][family]:.3f}"], family


@pytest.mark.parametrize("name", sorted(RECORD["jobs"]))
def test_docs_example_jobs_are_the_records(name):
    rows = table_rows("docs/jobs.md", "job | `ran`")
    want = RECORD["jobs"][name]
    assert name in rows, f"docs/jobs.md's example-job table has no row for {name}"
    cells = rows[name]
    assert cells[1] == want["base_model"] and cells[2] == want["status"]
    got = [re.sub(r"\*", "", c) for c in cells[4:7]]
    assert got == [f"{want['hidden_score']:.3f}", f"{want['baseline']:.3f}", f"{want['uplift']:+.3f}"], name


def test_the_burners_spin_while_the_check_runs_and_stop_after_it():
    """``--burn N``: N processes on the CPU for the block's duration, gone after it, also when the block fails."""
    with pytest.raises(RuntimeError), reproduce.burners(2) as procs:
        assert len(procs) == 2 and all(q.poll() is None for q in procs), "spinning while the run runs"
        raise RuntimeError("the run failed")
    assert all(q.poll() is not None for q in procs), "stopped after it"


def test_a_kind_of_cpu_with_its_own_record_is_compared_with_it(tmp_path, monkeypatch):
    """The reference record on its own kind of CPU (or where no other record exists); a kind with a record of its
    own gets that one; ``--record`` on another kind writes that kind's file and leaves the reference alone."""
    monkeypatch.setattr(reproduce, "KIND_RECORDS", tmp_path / "kinds")
    amd = {"machine": "x86_64", "vendor": "AuthenticAMD", "torch_capability": "AVX2"}
    intel = {"machine": "x86_64", "vendor": "GenuineIntel", "torch_capability": "AVX512"}
    reference = {"cpu": amd, "jobs": {"a": job(0.09)}}
    assert reproduce.record_for(reference, amd) == (reference, reproduce.RECORD)
    assert reproduce.record_for(reference, intel) == (reference, reproduce.RECORD), "no record of this kind yet"
    assert reproduce.record_for(None, intel) == (None, reproduce.RECORD)
    path = reproduce.kind_record_path(intel)
    assert path.parent == tmp_path / "kinds" and path.name == "x86_64-GenuineIntel-AVX512.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"cpu": intel, "jobs": {"a": job(0.125)}}))
    record, where = reproduce.record_for(reference, intel)
    assert where == path and record["jobs"]["a"]["uplift"] == 0.125
    assert reproduce.record_for(reference, amd)[1] == reproduce.RECORD


def test_a_part_a_kinds_record_lacks_is_the_references_within_tolerance(tmp_path, monkeypatch):
    """A kind's record without baselines (dropped when the split moved them): the reference's baselines, compared
    within tolerance even on that kind's own software; its own parts stay exact; --record there keeps none of
    the borrowed parts."""
    import argparse

    monkeypatch.setattr(reproduce, "KIND_RECORDS", tmp_path / "kinds")
    amd = {"machine": "x86_64", "vendor": "AuthenticAMD", "torch_capability": "AVX512"}
    intel = {"machine": "x86_64", "vendor": "GenuineIntel", "torch_capability": "AVX512"}
    reference = {"cpu": amd, "baselines": {"tiny-s": {"calc_chain": 0.065}}, "jobs": {"a": job(0.09)}}
    path = reproduce.kind_record_path(intel)
    path.parent.mkdir()
    path.write_text(json.dumps({"cpu": intel, "jobs": {"a": job(0.125)}}))
    record, where = reproduce.record_for(reference, intel)
    assert where == path and record["borrowed"] == ["baselines"] and record["jobs"]["a"]["uplift"] == 0.125
    near = {"baselines": {"tiny-s": {"calc_chain": 0.07}}, "jobs": {"a": job(0.125)}}
    assert reproduce.compare(record, near, exact=True) == [], "0.005 on a borrowed part is within 0.01"
    assert reproduce.compare(record, {"jobs": {"a": job(0.12)}}, exact=True), "its own part stays exact"
    monkeypatch.setattr(reproduce, "cpu_kind", lambda: intel)
    monkeypatch.setattr(reproduce, "run_models", lambda: {"tiny-s": {"model.safetensors": "ab"}})
    args = argparse.Namespace(workdir=tmp_path / "work", markdown=False, record=True, jobs="", exact=False,
                              json=None, burn=0, kernels="native")
    assert reproduce.compare_or_record(args, ["models"], record, where) == 0
    written = json.loads(path.read_text())
    assert "baselines" not in written and "borrowed" not in written and written["jobs"]["a"]["uplift"] == 0.125


def test_recording_on_another_kind_of_cpu_writes_that_kinds_record(tmp_path, monkeypatch, capsys):
    import argparse

    monkeypatch.setattr(reproduce, "KIND_RECORDS", tmp_path / "kinds")
    monkeypatch.setattr(reproduce, "RECORD", tmp_path / "reference.json")
    amd = {"machine": "x86_64", "vendor": "AuthenticAMD", "torch_capability": "AVX2"}
    intel = {"machine": "x86_64", "vendor": "GenuineIntel", "torch_capability": "AVX512"}
    reference = {"cpu": amd, "models": {"tiny-s": {"model.safetensors": "ab"}}}
    reproduce.RECORD.write_text(json.dumps(reference))
    monkeypatch.setattr(reproduce, "cpu_kind", lambda: intel)
    monkeypatch.setattr(reproduce, "run_models", lambda: {"tiny-s": {"model.safetensors": "ab"}})
    args = argparse.Namespace(workdir=tmp_path / "work", markdown=False, record=True, jobs="", exact=False,
                              json=None, burn=0, kernels="native")
    assert reproduce.compare_or_record(args, ["models"], reference, reproduce.RECORD) == 0
    written = json.loads(reproduce.kind_record_path(intel).read_text())
    assert written["cpu"] == intel and written["models"] == reference["models"]
    assert json.loads(reproduce.RECORD.read_text()) == reference, "the reference is left alone"
    assert "recorded in" in capsys.readouterr().out


def test_a_metric_added_after_the_record_is_named_not_failed():
    record = {"main": {"steps": 2, "metrics": [{"step": 0, "reward_mean": 0.2}, {"step": 1, "reward_mean": 0.3}]}}
    now = {"main": {"steps": 2, "metrics": [{"step": 0, "reward_mean": 0.2, "usd": 0.01},
                                            {"step": 1, "reward_mean": 0.3, "usd": 0.02}]}}
    assert reproduce.compare(record, now, exact=True) == []
    assert reproduce.unrecorded(record, now) == ["usd"]
    now["main"]["metrics"][1]["reward_mean"] = 0.31
    assert reproduce.compare(record, now, exact=True), "the recorded metrics are still compared"
