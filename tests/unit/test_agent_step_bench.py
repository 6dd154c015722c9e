"""bench/agent_step.py and bench/_memory.py: a phase's peak is its own process's and its own phase's, the
update's phases are all recorded, and the step side runs one step without the fixed-seed evaluations."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import _memory as M  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")


def run_python(code: str) -> str:
    """``code`` in a fresh interpreter that can import the bench's modules; its stdout."""
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_a_child_measures_its_own_peak_where_ru_maxrss_reports_its_parents():
    # The parent touches 400 MB and frees it, then starts a child: Linux hands the parent's high-water mark to the
    # child's ru_maxrss over exec (the bench's update sides read >= 5 GB that way); VmHWM is the child's own.
    out = run_python("""
        import subprocess, sys
        block = bytearray(400_000_000)
        del block
        child = ("import sys, resource; sys.path.insert(0, sys.argv[1]); import _memory as M; "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, M.peak_gb())")
        print(subprocess.run([sys.executable, "-c", child, sys.path[0]], capture_output=True, text=True,
                             check=True).stdout)
    """)
    ru_maxrss, own = map(float, out.split())
    assert ru_maxrss >= 0.39, "the kernel no longer carries the parent's peak over: this test's premise is gone"
    assert own < 0.1


def test_a_phase_sees_its_own_transient_peak_and_not_the_one_before():
    out = run_python("""
        import json, _memory as M
        rows = []
        with M.phase("allocates", rows):
            block = bytearray(300_000_000)
            del block
        with M.phase("quiet", rows):
            pass
        print(json.dumps([r["peak_gb"] - r["rss_start_gb"] for r in rows]))
    """)
    allocates, quiet = map(float, out.strip()[1:-1].split(","))
    assert allocates >= 0.28 and quiet < 0.05


def test_the_update_reports_forward_and_backward_of_each_micro_batch_and_one_optimizer_step():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from helpers.updates import plain_update

    from agent_trainer.outer_loop.rl.objective import TurnSample
    from agent_trainer.outer_loop.rl.policy import AgentPolicy

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    model = get_peft_model(Qwen3ForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                             task_type="CAUSAL_LM"))
    policy = AgentPolicy(model, types.SimpleNamespace(pad_token_id=0), plain_update(micro_batch_size=2))
    probe = M.make_phase_callback(policy.model, policy.module.configure_optimizers)
    policy.trainer_kwargs["callbacks"] = [probe]
    samples = [TurnSample([1, 2, 3 + i], [10 + i, 20, 30], [-1.0] * 3, 1.0 - i) for i in range(3)]
    policy.update(samples)
    assert [r["phase"] for r in probe.rows] == ["forward 0", "backward 0", "forward 1", "backward 1",
                                                "optimizer step 1"]
    forward, step = probe.rows[0], probe.rows[-1]
    assert forward["rows"] == 2 and forward["saved_for_backward_gb"] > 0
    assert step["grads_gb"] > 0 and step["optimizer_state_gb"] > 0   # Adam's moments exist after its first step
    assert all(r["peak_gb"] >= r["rss_end_gb"] > 0 for r in probe.rows)


def test_the_step_bench_runs_one_step_of_the_recipe_without_its_evaluations():
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent_step", ROOT / "bench" / "agent_step.py")
    agent_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_step)
    assert agent_step.recipe_config([]).outer.train_eval_episodes > 0, "the recipe plays evaluations"
    outer = agent_step.recipe_config(list(agent_step.STEP_OVERRIDES)).outer
    assert outer.steps == 1 and outer.train_eval_episodes == 0 and outer.heldout_episodes == 0
    assert not outer.heldout_at_start


def test_the_step_side_reads_the_child_own_peak_while_it_runs():
    # at-train's peak over a step is read from its VmHWM while it runs (sampling and update in one process).
    child = "import time; block = bytearray(300_000_000); del block; time.sleep(1.0)"
    proc = subprocess.Popen([sys.executable, "-c", child])
    peak = M.watch_peak_gb(proc, every=0.05)
    assert proc.returncode == 0 and 0.28 <= peak < 1.0


def test_unknown_parts_are_one_line_errors():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_step.py"), "--parts", "update,steps"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--parts: unknown steps; known: sampling, update, step" in proc.stderr
    assert "Traceback" not in proc.stderr
