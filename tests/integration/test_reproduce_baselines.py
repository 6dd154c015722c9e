"""This machine makes the docs' baselines: the shipped models' bytes and their hidden-set scores, scored afresh,
equal `bench/results/reproduce.json` (exactly on the record's software and kind of CPU, within its stated
tolerance elsewhere)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_models_and_their_baselines_reproduce(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "reproduce.py"), "--parts", "models,baselines",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "models: the same" in proc.stdout and "baselines: the same" in proc.stdout
