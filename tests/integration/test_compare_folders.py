"""at-compare on run and sweep folders: a real SQLite MLflow store with runs that differ in outer.lora_r,
run folders with run.json under a sweep folder, the comparison through ``agent_trainer.commands.compare.run``."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from agent_trainer.config import compose_config
from agent_trainer.tracking import Tracker


def _params(lora_r: int, job: int) -> dict:
    return {"agent": {"model": "tiny-agent"}, "strategy": {"mode": "none"}, "outer": {"lora_r": lora_r, "lr": 1e-4},
            "seed": 0, "run_id": f"sweep/{job}", "hydra": {"job": {"num": job}},
            "hardware": {"launcher_dir": f"/runs/{job}/submitit"}}   # follows runs_dir: not a setting


def _log_run(uri: str, tmp: Path, name: str, params: dict, grouped: bool, offset: float) -> tuple[str, list]:
    """One at-train-like run: params and 3 steps of reward, validation and cost (grouped or bare names)."""
    key = (lambda k, g: f"{g}/{k}") if grouped else (lambda k, g: k)
    points = [(step, offset + 0.1 * step) for step in range(3)]
    with Tracker(uri, experiment="cmp", run_name=name, artifact_location=str(tmp / "mlartifacts"),
                 tags={"command": "at-train"}) as tr:
        tr.log_config(params)
        for step, value in points:
            tr.log_metrics({key("reward_mean", "reward"): value, key("validation_mean", "stage"): 0.5 + value,
                            key("usd_cumulative", "cost"): 0.01 * (step + 1)}, step=step)
        tr.log_metrics({"reward/reward_last3": offset + 1.0})   # what the command returned (cli.call logs it)
        tr.set_tags({"returned": "reward/reward_last3"})
    return tr.run_id, points


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """sweep/0 (lora_r=4, grouped metric names), sweep/1 (lora_r=16, bare names), sweep/2 failed before MLflow,
    and a run without a folder (lora_r=8)."""
    tmp = tmp_path_factory.mktemp("compare")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    runs = {}
    for job, (lora_r, grouped) in enumerate([(4, True), (16, False)]):
        name = f"train lora_r={lora_r} #{job} sweep"
        rid, points = _log_run(uri, tmp, name, _params(lora_r, job), grouped, 0.2 * job)
        folder = tmp / "sweep" / str(job)
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({
            "mlflow_run_id": rid, "tracking_uri": uri, "command": "at-train", "run_name": name, "status": "ok",
            "error": None, "overrides": [f"outer.lora_r={lora_r}"], "swept": {"outer.lora_r": str(lora_r)},
            "value": points[-1][1]}))
        runs[lora_r] = (rid, points)
    (tmp / "sweep" / "2").mkdir()
    (tmp / "sweep" / "2" / "run.json").write_text(json.dumps({
        "mlflow_run_id": None, "tracking_uri": None, "command": "at-train", "run_name": "train lora_r=64 #2 sweep",
        "status": "failed", "error": "ConfigError: outer.lora_r too large", "overrides": ["outer.lora_r=64"],
        "swept": {"outer.lora_r": "64"}, "value": None}))
    runs[8] = _log_run(uri, tmp, "train lora_r=8", _params(8, 3), True, 0.05)
    return {"tmp": tmp, "runs": runs}


def _compare(store, out: str, *overrides: str, monkeypatch=None) -> tuple[dict, dict[str, dict]]:
    """Run at-compare; returns the paths and, per PNG, its legend and x tick labels as matplotlib drew them."""
    import agent_trainer.outer_loop.report.plots
    from agent_trainer.commands import compare as at_compare

    drawn: dict[str, dict] = {}
    save = agent_trainer.outer_loop.report.plots.save_figure

    def spy(fig, path):
        drawn[Path(path).name] = {
            "axes": len(fig.axes),
            "legends": [[t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
                        for ax in fig.axes],
            "xticks": [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes]}
        return save(fig, path)

    if monkeypatch is not None:
        monkeypatch.setattr(agent_trainer.outer_loop.report.plots, "save_figure", spy)
    tmp = store["tmp"]
    cfg = compose_config([f"runs_dir={tmp}", f"run_id={out}", f"out={tmp / out}", *overrides], "compare")
    return at_compare.run(cfg), drawn


def _csv(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_sweep_folder_rows_tables_and_legends(store, monkeypatch, capsys):
    tmp, runs = store["tmp"], store["runs"]
    paths, drawn = _compare(store, "cmp_sweep", f"runs=['{tmp / 'sweep'}']", monkeypatch=monkeypatch)
    out = tmp / "cmp_sweep"
    # one row per swept setting, the setting a column of both tables (hydra.* and run_id are not settings)
    configs = _csv(out / "configs.csv")
    assert [(r["config"], r["outer.lora_r"], r["runs"]) for r in configs] == \
        [("outer.lora_r=4", "4", "1"), ("outer.lora_r=16", "16", "1")]
    table = _csv(out / "compare.csv")
    assert [(r["run_id"], r["outer.lora_r"]) for r in table] == [(runs[4][0], "4"), (runs[16][0], "16")]
    assert "hydra.job.num" not in table[0] and "run_id" in table[0] and "seed" not in table[0]
    assert "| outer.lora_r=4 | 4 |" in (out / "configs.md").read_text()
    # each job's status and the value it returned (what the sweep ranked by), next to the last step's reward
    assert [(r["status"], float(r["value"])) for r in table] == [("FINISHED", 1.0), ("FINISHED", 1.2)]
    assert [float(r["value_mean"]) for r in configs] == [1.0, 1.2]
    # grouped (reward/reward_mean) and bare (reward_mean) metric names read alike
    for row, lora_r in zip(table, (4, 16)):
        assert float(row["reward"]) == pytest.approx(runs[lora_r][1][-1][1])
        assert float(row["validation"]) == pytest.approx(0.5 + runs[lora_r][1][-1][1])
        assert float(row["usd"]) == pytest.approx(0.03)
    data = json.loads((out / "plot_data.json").read_text())
    assert list(data["legend"]) == ["lora_r=4", "lora_r=16"]
    assert {k: [tuple(p) for p in v["points"]] for k, v in data["reward_curves"].items()} == \
        {"lora_r=4": runs[4][1], "lora_r=16": runs[16][1]}
    assert data["stages"]["runs"] == ["lora_r=4", "lora_r=16"] and set(data["stages"]) == {"runs", "validation"}
    # legends as drawn: the setting, not the run name; the empty hidden-score panel is not drawn
    assert drawn["reward_curves.png"]["axes"] == 1
    assert drawn["reward_curves.png"]["legends"] == [["lora_r=4 (reward_mean)", "lora_r=16 (reward_mean)"]]
    assert drawn["stages.png"]["xticks"] == [["lora_r=4", "lora_r=16"]]
    # empty PNGs are not written, and plot_data says why
    assert set(data["skipped"]) == {"job_scores", "switch_rates", "adoption"}
    assert "hidden score per job" in data["skipped"]["job_scores"]
    assert not (out / "switches.png").exists() and not (out / "adoption.png").exists()
    assert {"reward_curves", "stages", "cost"} <= set(paths) and "adoption" not in paths
    assert (out / "cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the failed job (no MLflow run) is skipped with a note, as is each PNG not written
    notes = [x for x in capsys.readouterr().out.splitlines() if x.startswith("at-compare: ")]
    assert any("skipped" in x and str(tmp / "sweep" / "2") in x and "outer.lora_r too large" in x for x in notes)
    assert any("adoption.png not written: no run logged suggestion adoption" in x for x in notes)


def test_folder_and_mlflow_id_mixed(store):
    tmp, runs = store["tmp"], store["runs"]
    # a run folder by its run_id under runs_dir, and a bare MLflow run id
    _compare(store, "cmp_mix", f"runs=[sweep/1,{runs[8][0]}]")
    table = _csv(tmp / "cmp_mix" / "compare.csv")
    assert [(r["run_id"], r["outer.lora_r"]) for r in table] == [(runs[16][0], "16"), (runs[8][0], "8")]
    assert list(json.loads((tmp / "cmp_mix" / "plot_data.json").read_text())["legend"]) == ["lora_r=16", "lora_r=8"]


def test_explicit_group_by_and_nothing_differs(store):
    tmp, runs = store["tmp"], store["runs"]
    _compare(store, "cmp_seed", f"runs=['{tmp / 'sweep'}']", "group_by=[seed]")
    assert [(r["config"], r["runs"]) for r in _csv(tmp / "cmp_seed" / "configs.csv")] == [("seed=0", "2")]
    # one run: nothing differs, so today's grouping and the run name as legend
    _compare(store, "cmp_one", f"runs=['{tmp / 'sweep' / '0'}']")
    assert [r["config"] for r in _csv(tmp / "cmp_one" / "configs.csv")] == \
        ["agent.model=tiny-agent strategy.mode=none"]
    legend = json.loads((tmp / "cmp_one" / "plot_data.json").read_text())["legend"]
    assert legend == {"train lora_r=4 #0 sweep": {"run": "train lora_r=4 #0 sweep", "run_id": runs[4][0],
                                                  "agent.model": "tiny-agent", "strategy.mode": "none"}}


@pytest.mark.parametrize("entry, says", [("plain", "not a run folder"), ("nowhere/at/all", "no such folder")])
def test_not_a_run_folder_is_one_clear_line(store, entry, says):
    from agent_trainer import cli

    tmp = store["tmp"]
    (tmp / "plain").mkdir(exist_ok=True)
    (tmp / "plain" / "notes.txt").write_text("not a run")
    t0 = time.monotonic()
    with pytest.raises(cli.UserError) as e:
        _compare(store, "cmp_bad", f"runs=[{entry}]")
    message = str(e.value)
    assert "\n" not in message and says in message and entry.split("/")[0] in message
    assert time.monotonic() - t0 < 5, "a folder that is not a run is refused without waiting on MLflow"


def test_runs_from_other_machines_are_said_beside_the_tables(store, capsys):
    """Two seeds run on different kinds of CPU, one resumed on a third: at-compare says so in machines.md and on
    the console (their numbers differ in the last digits even with the same settings); the same runs on one
    machine get no such file, and a stale one in the same folder is removed."""
    tmp = store["tmp"]
    zero, one = tmp / "sweep" / "0", tmp / "sweep" / "1"
    same = {"python": "3.11.7", "torch": "2.13.0", "cpu": {"machine": "x86_64", "vendor": "GenuineIntel",
                                                           "torch_capability": "AVX512"}}
    try:
        (zero / "versions.json").write_text(json.dumps(same))
        (one / "versions.json").write_text(json.dumps({**same, "cpu": {**same["cpu"], "vendor": "AuthenticAMD",
                                                                       "torch_capability": "AVX2"}}))
        (one / "resumes.jsonl").write_text(json.dumps({"steps_done": 2, "changes": {}, "machine": {
            "cpu.torch_capability": {"saved": "AVX2", "now": "AVX512"}}}) + "\n")
        paths, _ = _compare(store, "cmp_machines", f"runs=['{tmp / 'sweep'}']")
        said = (tmp / "cmp_machines" / "machines.md").read_text()
        assert paths["machines"] == tmp / "cmp_machines" / "machines.md"
        assert "- cpu.vendor differs: GenuineIntel in train lora_r=4 #0 sweep; AuthenticAMD in train lora_r=16" in said
        assert "- cpu.torch_capability differs: AVX512 in train lora_r=4 #0 sweep; AVX2 in" in said
        assert "torch differs" not in said and "python differs" not in said
        assert "train lora_r=16 #1 sweep: resumed after step 1 on another machine or software " \
               "(cpu.torch_capability AVX2 -> AVX512)" in said
        out = capsys.readouterr().out
        assert "at-compare: cpu.vendor differs: GenuineIntel in" in out
        (one / "versions.json").write_text(json.dumps(same))
        (one / "resumes.jsonl").unlink()
        paths, _ = _compare(store, "cmp_machines", f"runs=['{tmp / 'sweep'}']")
        assert "machines" not in paths and not (tmp / "cmp_machines" / "machines.md").exists()
    finally:
        for f in (zero / "versions.json", one / "versions.json", one / "resumes.jsonl"):
            f.unlink(missing_ok=True)
