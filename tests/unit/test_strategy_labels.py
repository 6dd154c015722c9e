"""Strategy labels s = (p, d, g) and switch detection on hand-labelled job sequences.

Each case is a sequence of ``ran`` records (what the inner loop says actually ran) with the labels,
switches (per adjacent executed pair: the components that changed, () for none) and the position
of the first switch, all worked out by hand from the definitions in ``agent_trainer.outer_loop.strategy.strategy``.
"""

from __future__ import annotations

import json

import pytest
import yaml

from agent_trainer.outer_loop.strategy import strategy as st


def stage(alg, peft="full", data="curated", steps=50):
    return {"algorithm": alg, "peft": peft, "data_source": data, "steps": steps}


def job(*stages):
    return {"stages": list(stages)}


SFT, SFT_L = job(stage("sft")), job(stage("sft", "lora"))
GRPO, GRPO_L = job(stage("grpo")), job(stage("grpo", "lora"))
DPO, DPO_L = job(stage("dpo", data="self_generated")), job(stage("dpo", "lora", data="self_generated"))
SFT_SELF, SFT_AGENT, SFT_MIX = job(stage("sft", data="self_generated")), job(stage("sft", data="agent")), \
    job(stage("sft", data="mixed"))
SFT_GRPO = job(stage("sft"), stage("grpo"))
SFT_GRPO_L = job(stage("sft"), stage("grpo", "lora"))
SFT_DPO = job(stage("sft"), stage("dpo", data="self_generated"))
INVALID = job(stage("sft", steps=0))          # refused: nothing trained
NOTHING = {"stages": []}
CRASHED_2ND = job(stage("sft", steps=30), stage("grpo", steps=0))  # the second stage never ran
DISTILL = job(stage("distill"))

# (name, sequence, labels, switch components per executed pair, first switch position)
CASES = [
    ("one job", [SFT], ["full_sft/curated/single"], [], None),
    ("same twice", [SFT, SFT], ["full_sft/curated/single"] * 2, [()], None),
    ("locked in, three", [GRPO, GRPO, GRPO], ["rl/curated/single"] * 3, [(), ()], None),
    ("sft to grpo", [SFT, GRPO], ["full_sft/curated/single", "rl/curated/single"], [("p",)], 2),
    ("full to lora", [SFT, SFT_L], ["full_sft/curated/single", "peft_sft/curated/single"], [("p",)], 2),
    ("lora grpo to full grpo", [GRPO_L, GRPO], ["peft_rl/curated/single", "rl/curated/single"], [("p",)], 2),
    ("curated to self-generated", [SFT, SFT_SELF], ["full_sft/curated/single", "full_sft/self_generated/single"],
     [("d",)], 2),
    ("agent data to mixed", [SFT_AGENT, SFT_MIX], ["full_sft/agent/single", "full_sft/mixed/single"], [("d",)], 2),
    ("late switch", [SFT, SFT, SFT, GRPO], ["full_sft/curated/single"] * 3 + ["rl/curated/single"],
     [(), (), ("p",)], 4),
    ("sft to preference", [SFT, DPO], ["full_sft/curated/single", "preference/self_generated/single"],
     [("p", "d")], 2),
    ("peft preference", [DPO_L, DPO_L], ["peft_preference/self_generated/single"] * 2, [()], None),
    ("grpo to sft>grpo: only the structure", [GRPO, SFT_GRPO], ["rl/curated/single", "rl/curated/sft>grpo"],
     [("g",)], 2),
    ("sft to sft>grpo", [SFT, SFT_GRPO], ["full_sft/curated/single", "rl/curated/sft>grpo"], [("p", "g")], 2),
    ("two-stage, adapter in stage 2", [SFT_GRPO, SFT_GRPO_L], ["rl/curated/sft>grpo", "peft_rl/curated/sft>grpo"],
     [("p",)], 2),
    ("sft>dpo mixes sources", [SFT_DPO], ["preference/mixed/sft>dpo"], [], None),
    ("invalid jobs are skipped", [SFT, INVALID, SFT], ["full_sft/curated/single", None, "full_sft/curated/single"],
     [()], None),
    ("a switch across an invalid job", [SFT, INVALID, NOTHING, GRPO],
     ["full_sft/curated/single", None, None, "rl/curated/single"], [("p",)], 2),
    ("nothing executed", [INVALID, NOTHING], [None, None], [], None),
    ("a stage that never ran is dropped", [SFT, CRASHED_2ND], ["full_sft/curated/single"] * 2, [()], None),
    ("back and forth", [SFT, GRPO, SFT, GRPO], ["full_sft/curated/single", "rl/curated/single"] * 2,
     [("p",), ("p",), ("p",)], 2),
    ("switch then stay", [GRPO, SFT_L, SFT_L, SFT_L], ["rl/curated/single"] + ["peft_sft/curated/single"] * 3,
     [("p",), (), ()], 2),
    ("everything changes", [GRPO_L, SFT_DPO], ["peft_rl/curated/single", "preference/mixed/sft>dpo"],
     [("p", "d", "g")], 2),
    ("distillation", [DISTILL, SFT], ["distillation/curated/single", "full_sft/curated/single"], [("p",)], 2),
    ("first job invalid, then stay", [INVALID, SFT_SELF, SFT_SELF],
     [None, "full_sft/self_generated/single", "full_sft/self_generated/single"], [()], None),
]


@pytest.mark.parametrize("name,seq,labels,comps,first", CASES, ids=[c[0] for c in CASES])
def test_hand_labelled_sequences(name, seq, labels, comps, first):
    got = [st.label(r) for r in seq]
    assert [str(x) if x else None for x in got] == labels
    executed = st.executed(got)
    pair_comps = [st.diff(a, b) for a, b in zip(executed, executed[1:])]
    assert pair_comps == comps
    sw = st.switches(got)
    assert [s.components for s in sw] == [c for c in comps if c]
    m = st.sequence_metrics(got)
    assert m["first_switch"] == first
    assert m["pairs"] == len(comps) and m["switches"] == sum(bool(c) for c in comps)
    assert m["switch_rate"] == (m["switches"] / m["pairs"] if comps else None)
    for c in st.COMPONENTS:
        assert m[f"switch_{c}"] == sum(c in x for x in comps)


def test_at_least_twenty_cases():
    assert len(CASES) >= 20


def test_aggregate_pools_pairs_not_episodes():
    seqs = [[st.label(r) for r in s] for _, s, *_ in CASES]
    per = [st.sequence_metrics(s) for s in seqs]
    agg = st.aggregate(per)
    pairs = sum(len(c[3]) for c in CASES)
    n_sw = sum(bool(x) for c in CASES for x in c[3])
    assert agg["pairs"] == pairs and agg["switches"] == n_sw
    assert agg["switch_rate"] == pytest.approx(n_sw / pairs)
    firsts = [c[4] for c in CASES if c[4] is not None]
    assert agg["first_switch_mean"] == pytest.approx(sum(firsts) / len(firsts))
    assert agg["share_switch_p"] == pytest.approx(sum("p" in x for c in CASES for x in c[3]) / n_sw)
    assert st.aggregate([])["switch_rate"] is None


def test_method_table():
    assert st.method("sft", None) == "full_sft" and st.method("SFT", "lora") == "peft_sft"
    assert st.method("grpo", "full") == "rl" and st.method("dpo", None) == "preference"
    assert st.method("dpo", "lora") == "peft_preference" and st.method("ppo", "lora") == "peft_ppo"


def _write_job(tmp_path, name, job_yaml: dict, result: dict):
    d = tmp_path / "jobs" / name
    (d / "job").mkdir(parents=True)
    (d / "output").mkdir()
    (d / "job" / "job.yaml").write_text(yaml.safe_dump(job_yaml))
    (d / "output" / "result.json").write_text(json.dumps({"job_dir": str(d / "job"), **result}))
    return d


def test_ran_is_derived_from_the_snapshot_when_the_result_has_none(tmp_path):
    src = {"sources": [{"family": "calc_chain", "size": 100}]}
    _write_job(tmp_path, "00", {"base_model": "tiny-s", "algorithm": "sft", "data": src},
               {"status": "ok", "steps": 40})
    _write_job(tmp_path, "01", {"base_model": "tiny-s", "algorithm": "grpo", "peft": {"r": 8}, "data": src,
                                "reward": {"functions": [{"name": "exact_match"}]}}, {"status": "ok", "steps": 20})
    _write_job(tmp_path, "02", {"base_model": "tiny-s", "algorithm": "sft", "data": {"file": "data.jsonl"}},
               {"status": "invalid", "steps": 0})
    _write_job(tmp_path, "03", {"base_model": "tiny-s", "data": {**src, "file": "d.jsonl"},
                                "stages": [{"algorithm": "sft", "hyperparameters": {"max_steps": 30}},
                                           {"algorithm": "grpo", "peft": {"r": 4},
                                            "hyperparameters": {"max_steps": 30}}]},
               {"status": "crashed", "steps": 30})
    own = {"stages": [stage("dpo", data="self_generated", steps=12)]}
    _write_job(tmp_path, "04", {"base_model": "tiny-s", "algorithm": "sft", "data": src},
               {"status": "ok", "steps": 12, "ran": own})
    rows = st.job_labels(tmp_path / "jobs")
    assert [r["label"] and str(st.from_dict(r["label"])) for r in rows] == [
        "full_sft/curated/single", "peft_rl/curated/single", None, "full_sft/mixed/single",
        "preference/self_generated/single"]
    # the crashed two-stage job: stage 1 ran its 30 steps, stage 2 none
    assert [s["steps"] for s in rows[3]["ran"]["stages"]] == [30, 0]
    assert rows[4]["ran"] == own  # the inner loop's own record wins


def test_data_source_of_a_block():
    assert st.data_source({"sources": [{"family": "x"}]}) == "curated"
    assert st.data_source({"sources": [{"family": "x", "self_generated": {}}]}) == "self_generated"
    assert st.data_source({"sources": [{"family": "x", "self_generated": True}, {"family": "y"}]}) == "mixed"
    assert st.data_source({"file": "data.jsonl"}) == "agent"
    assert st.data_source({"sources": [{"family": "x"}]}, "dpo") == "self_generated"


def test_run_metrics_pool_episode_summaries():
    eps = [{"jobs": [], **st.sequence_metrics([st.label(r) for r in seq])} for seq in ([SFT, GRPO], [SFT, SFT, SFT])]
    m = st.run_metrics(eps + [{}])   # an episode without a summary is skipped
    assert m["pairs"] == 3.0 and m["switches"] == 1.0 and m["switch_rate"] == pytest.approx(1 / 3)
    assert m["first_switch_mean"] == 2.0 and m["share_switch_p"] == 1.0 and m["share_switch_d"] == 0.0
