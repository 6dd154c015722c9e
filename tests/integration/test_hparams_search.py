"""``at-train -m hparams_search=smoke_optuna``: Hydra's Optuna sweeper drives at-train, which returns the
value it maximizes (the mean reward of the last 3 outer steps). Needs the sweep extra: pip install -e '.[sweep]'."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("optuna") is None
    or importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None,
    reason="the sweep extra is not installed (pip install -e '.[sweep]' -c requirements/cpu.txt)",
)


def _reward_last3(job: Path) -> float:
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    last = [r["reward_mean"] for r in rows[-3:]]
    return sum(last) / len(last)


def _search(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``at-train -m hparams_search=smoke_optuna`` of two trials of the smoke experiment, run id ``search``."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [str(BIN / "at-train"), "-m", "hparams_search=smoke_optuna", "experiment=smoke", "hydra.sweeper.n_trials=2",
         *overrides, "tracking=off", f"runs_dir={tmp_path}", "run_id=search"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


def test_optuna_search_runs_every_trial_and_names_the_best(tmp_path, built_agent):
    proc = _search(tmp_path, "outer.steps=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "search"
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"], "one run folder per trial"

    # each trial got its settings from the sampler, inside the search space of configs/hparams_search/smoke_optuna.yaml
    chosen = []
    for job in jobs:
        overrides = dict(o.split("=", 1) for o in OmegaConf.load(job / ".hydra" / "overrides.yaml"))
        assert 3e-4 <= float(overrides["outer.lr"]) <= 5e-3 and overrides["outer.lora_r"] in ("4", "8", "16")
        assert (job / "metrics.jsonl").is_file(), f"trial {job.name} did not train"
        chosen.append((float(overrides["outer.lr"]), int(overrides["outer.lora_r"]), _reward_last3(job)))
    assert chosen[0][0] != chosen[1][0], "the sampler proposed the same learning rate twice"

    results = OmegaConf.to_container(OmegaConf.load(sweep / "optimization_results.yaml"))
    assert results["name"] == "optuna" and set(results["best_params"]) == {"outer.lr", "outer.lora_r"}
    best = max(chosen, key=lambda c: c[2])
    assert results["best_value"] == pytest.approx(best[2]), "Optuna maximized what at-train returned"
    assert (results["best_params"]["outer.lr"], results["best_params"]["outer.lora_r"]) in [c[:2] for c in chosen]


def test_a_search_whose_every_trial_fails_ends_with_the_table_and_one_line(tmp_path):
    proc = _search(tmp_path, "task.train_families=[no_such_family]")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "0 ok, 2 failed" in proc.stdout and "| 1 | failed |" in proc.stdout
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "at-train: error: the search completed no trial (2 failed; table " \
                                                   "above): no best settings"
    assert (tmp_path / "search" / "sweep.md").is_file()
