"""The sandbox's policy and command lines, the contamination matcher and the lineage check, each alone.

    .venv/bin/pytest tests/unit/test_sandbox.py -q          (~10 s; real bubblewrap where installed)

The attacks themselves, run as jobs through the harness, are in tests/integration/test_redteam.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_trainer.config import InnerConfig
from agent_trainer.evaluation.contamination import NGRAM, find_overlap, tokens
from agent_trainer.evaluation.families import FAMILIES, get_family
from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.evaluation.lineage import lineage_mismatch
from agent_trainer.inner_loop.spec.jobspec import JobSpec
from agent_trainer.inner_loop.spec.jobfiles import job_file_problems
from agent_trainer.inner_loop.isolation.sandbox import (REWARD_HOST_IN_SANDBOX, SandboxPolicy, bwrap_problem,
                                reward_host_argv, scrub_env, trainer_wrapper)

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unusable: {bwrap_problem()}")


def _spec(code: bool = False, data: bool = False) -> JobSpec:
    raw = {"base_model": "tiny-s", "algorithm": "grpo",
           "data": {"sources": [{"family": "calc_chain"}], **({"file": "data.jsonl"} if data else {})},
           "reward": {"functions": [{"name": "f", "source": "file"} if code else {"name": "exact_match"}]}}
    return JobSpec.model_validate(raw)


# --- policy -------------------------------------------------------------------------------------


def test_policy_refuses_agent_code_without_bwrap_unless_unsafe_is_allowed():
    missing = SandboxPolicy(bwrap="no-such-bwrap-here")
    assert missing.refusal(_spec()) is None, "library-only jobs never need the sandbox"
    why = missing.refusal(_spec(code=True))
    assert why and "not installed" in why and "allow_unsafe" in why
    assert "agent-written data" in missing.refusal(_spec(data=True))
    assert SandboxPolicy(bwrap="no-such-bwrap-here", allow_unsafe=True).refusal(_spec(code=True)) is None
    assert "sandbox is off" in SandboxPolicy(sandbox=False).refusal(_spec(code=True))


def test_policy_from_values_and_config():
    assert SandboxPolicy.coerce(None) == SandboxPolicy() == SandboxPolicy.coerce(True)
    assert SandboxPolicy.coerce(False).sandbox is False
    p = SandboxPolicy.coerce({"allow_unsafe": True, "sandbox_max_processes": 8})
    assert p.allow_unsafe and p.sandbox_max_processes == 8 and SandboxPolicy.coerce(p.as_dict()) == p
    with pytest.raises(ValueError, match="unknown sandbox setting"):
        SandboxPolicy.coerce({"alow_unsafe": True})
    inner = InnerConfig(sandbox=False, allow_unsafe=True, sandbox_memory_gb=None, sandbox_max_processes=5,
                        reward_timeout_s=7.0)
    p = SandboxPolicy.from_config(inner)
    assert (p.sandbox, p.allow_unsafe, p.sandbox_memory_gb, p.sandbox_max_processes, p.reward_timeout_s) == (
        False, True, None, 5, 7.0)


def test_scrub_env_drops_secrets_and_unknown_names():
    env = {"PATH": "/bin", "HOME": "/h", "OPENAI_API_KEY": "sk-1", "HF_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
           "MLFLOW_TRACKING_URI": "sqlite:///x", "PYTHONPATH": "/p", "OMP_NUM_THREADS": "1"}
    # PYTHONPATH too: children run isolated (-I), and a path there could point into a job folder.
    assert scrub_env(env) == {"PATH": "/bin", "HOME": "/h", "OMP_NUM_THREADS": "1"}


def test_trainer_command_line_mounts_only_what_the_job_needs(tmp_path):
    job, out, model = tmp_path / "job", tmp_path / "out", tmp_path / "model"
    for d in (job, out, model):
        d.mkdir()
    argv = trainer_wrapper(SandboxPolicy(), job_dir=job, output_dir=out, model_dir=model, deadline_s=100,
                           threads=1)(["python", "-m", "agent_trainer.inner_loop.run.worker"])
    joined = " ".join(argv)
    for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    assert f"--bind {out} {out}" in joined and f"--ro-bind {job} {job}" in joined
    assert f"--ro-bind {model} {model}" in joined
    assert "--bind" not in joined.replace(f"--bind {out} {out}", "").split(), "only the output folder is writable"
    assert "/dev/null" in joined and "hidden_eval.py" in joined, "the hidden-eval module is masked"
    assert "runs" not in {Path(a).name for a in argv} and "mlflow.db" not in joined
    assert argv[-3:] == ["python", "-m", "agent_trainer.inner_loop.run.worker"]


@needs_bwrap
def test_trainer_sandbox_really_isolates(tmp_path, monkeypatch):
    job, out, model, secret = tmp_path / "job", tmp_path / "out", tmp_path / "model", tmp_path / "secret.txt"
    for d in (job, out, model):
        d.mkdir()
    secret.write_text("harness secret")
    monkeypatch.setenv("AT_TEST_SECRET_KEY", "planted-secret")
    code = f"""
import json, os, socket, pathlib
r = {{}}
def attempt(name, fn):
    try: r[name] = repr(fn())
    except Exception as e: r[name] = type(e).__name__
attempt("write_job", lambda: pathlib.Path({str(job)!r}, "x").write_text("x"))
attempt("write_out", lambda: pathlib.Path({str(out)!r}, "x").write_text("x"))
attempt("read_secret", lambda: pathlib.Path({str(secret)!r}).read_text())
attempt("net", lambda: socket.create_connection(("127.0.0.1", 9), timeout=2))
attempt("hidden_eval", lambda: pathlib.Path(__import__("agent_trainer.evaluation", fromlist=["__name__"]).__file__).with_name("hidden_eval.py").read_text())
root = pathlib.Path(__import__("agent_trainer").__file__).parent
r["rooms"] = sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.iterdir()) and p.name != "__pycache__")
attempt("write_room", lambda: (root / "outer_loop" / "x.py").write_text("x"))
r["env"] = sorted(os.environ)
print(json.dumps(r))
"""
    wrap = trainer_wrapper(SandboxPolicy(), job_dir=job, output_dir=out, model_dir=model, deadline_s=60, threads=1)
    p = subprocess.run(wrap([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["write_job"] == "OSError" and r["read_secret"] == "FileNotFoundError"
    assert r["write_out"] == "1" and r["net"] in ("OSError", "ConnectionRefusedError")
    assert r["hidden_eval"] in ("PermissionError", "''"), "the hidden-eval module is masked inside the sandbox"
    assert not any("SECRET" in k or "KEY" in k for k in r["env"])
    assert r["rooms"] == ["evaluation", "inner_loop"], "the agent's side and the commands are not mounted"
    assert r["write_room"] in ("OSError", "PermissionError"), "an empty read-only folder"


@needs_bwrap
def test_reward_host_runs_as_its_own_uid_with_a_process_cap(tmp_path):
    import socket

    a, b = socket.socketpair()
    argv = reward_host_argv(SandboxPolicy(sandbox_max_processes=8), job_dir=tmp_path, fd=b.fileno(), deadline_s=30)
    host = len(argv) - 1 - argv[::-1].index(REWARD_HOST_IN_SANDBOX)  # keep the launcher; a probe, not the host
    probe = [*argv[:host], "-c",
             "import os, resource; print(os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0], os.listdir('/'))"]
    p = subprocess.run(probe, capture_output=True, text=True, timeout=60, pass_fds=(b.fileno(),))
    a.close(), b.close()
    assert p.returncode == 0, p.stderr
    uid, nproc, listing = p.stdout.split(" ", 2)
    if os.geteuid() == 0:
        assert int(uid) >= 3_000_000 and int(nproc) == 8
    assert "'sandbox'" in listing and "'home'" not in listing, "a minimal root with the host script only"


def test_job_file_links_are_problems(tmp_path):
    (tmp_path / "outside.txt").write_text("x")
    job = tmp_path / "job"
    job.mkdir()
    (job / "data.jsonl").symlink_to(tmp_path / "outside.txt")
    (job / "reward.py").write_text("")
    problems = dict(job_file_problems(job, ["data.jsonl", "reward.py", "missing.py"]))
    assert list(problems) == ["data.jsonl"] and "symbolic link" in problems["data.jsonl"]


# --- contamination ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_library_rows_never_look_contaminated(family):
    rows = get_family(family).training_examples(seed=3, n=3000)
    report = find_overlap(family, 200, [(f"row {i}", f"{e.prompt} \x00 {e.answer}") for i, e in enumerate(rows)])
    assert report.hits == 0 and not report.flagged


def test_hidden_items_are_found_exact_embedded_and_respelled():
    h = hidden_set("calc_chain", 200)
    texts = [("exact", h[0].prompt), ("spaced", h[1].prompt.replace("-", " - ").upper()),
             ("embedded", f"Q: {h[2].prompt} A: {h[2].answer}"), ("table", f"ANSWERS = {{{h[3].prompt!r}: 7}}"),
             ("clean", "calc: 1+1=")]
    r = find_overlap("calc_chain", 200, texts)
    assert r.flagged and r.hits == 4 and r.kinds["exact"] == 2 and r.kinds["contained"] == 2
    assert {s["source"] for s in r.sources} == {"exact", "spaced", "embedded", "table"}
    assert h[0].prompt not in json.dumps(r.to_dict()), "the report never carries hidden text"


def test_long_hidden_items_match_on_a_distinctive_piece():
    from agent_trainer.evaluation.contamination import _index

    gram, i = next(iter(_index("triage", 200).grams.items()))  # NGRAM runs of a long item no public item has
    partial = " ".join(gram) + " and then something else entirely"
    r = find_overlap("triage", 200, [("a", partial), ("b", " ".join(gram[1:]))])
    assert r.hits == 1 and r.sources[0]["item"] == i and r.kinds["ngram"] == 1


# --- lineage ------------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_lineage_accepts_the_base_and_catches_each_substitution(built_models, tmp_path):
    from safetensors.torch import load_file, save_file

    base, other = Path(built_models["tiny-s"]), Path(built_models["tiny-m"])
    assert lineage_mismatch(base, base) is None
    assert "config" in lineage_mismatch(other, base)
    ck = _copy(base, tmp_path / "cfg")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (ck / "config.json").write_text(json.dumps(cfg))
    assert "rope_scaling" in lineage_mismatch(ck, base)
    ck = _copy(base, tmp_path / "shape")
    tensors = load_file(ck / "model.safetensors")
    name = next(iter(tensors))
    tensors[name] = tensors[name][:1].clone()
    save_file(tensors, ck / "model.safetensors")
    assert "shape" in lineage_mismatch(ck, base)
    ck = _copy(base, tmp_path / "gen")
    gen = json.loads((ck / "generation_config.json").read_text())
    (ck / "generation_config.json").write_text(json.dumps({**gen, "bad_words_ids": [[5]]}))
    assert "bad_words_ids" in lineage_mismatch(ck, base)
    eos = gen["eos_token_id"]  # transformers 5.10 saves it as a one-element list: the same stop token
    (ck / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [eos]}))
    assert lineage_mismatch(ck, base) is None
    (ck / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [eos, 5]}))
    assert "eos_token_id" in lineage_mismatch(ck, base)
    ck = _copy(base, tmp_path / "listed")  # only token ids may be spelt as a one-element list
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": [cfg["num_hidden_layers"]]}))
    assert "num_hidden_layers" in lineage_mismatch(ck, base)
    ck = _copy(base, tmp_path / "code")
    (ck / "modeling_evil.py").write_text("")
    assert "code file" in lineage_mismatch(ck, base)
    ck = _copy(base, tmp_path / "link")
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").symlink_to(base / "model.safetensors")
    assert "symbolic link" in lineage_mismatch(ck, base)


# --- the harness's use of the policy ------------------------------------------------------------

REWARD = "def mine(prompts, completions, answer, **kwargs):\n    return [float(c == a) for c, a in zip(completions, answer)]\n"


def _file_reward_job(tmp_path: Path) -> Path:
    import yaml

    job = tmp_path / "job"
    job.mkdir()
    (job / "reward.py").write_text(REWARD)
    (job / "job.yaml").write_text(yaml.safe_dump({
        "base_model": "tiny-s", "algorithm": "grpo", "data": {"sources": [{"family": "calc_chain", "size": 16}]},
        "hyperparameters": {"batch_size": 8, "num_generations": 4, "max_steps": 2},
        "reward": {"functions": [{"name": "mine", "source": "file"}]}}))
    return job


def test_validation_refuses_agent_code_when_the_sandbox_is_unavailable(tmp_path):
    from agent_trainer.inner_loop.spec.validate import validate_job

    job = _file_reward_job(tmp_path)
    r = validate_job(job, "examples/tasks/calc_chain_v1_fast.json", dry_run=False,
                     sandbox=SandboxPolicy(bwrap="no-such-bwrap-here"))
    assert not r.ok and [f.field for f in r.errors] == ["sandbox"] and "allow_unsafe" in r.errors[0].message
    r = validate_job(job, "examples/tasks/calc_chain_v1_fast.json", dry_run=False,
                     sandbox=SandboxPolicy(bwrap="no-such-bwrap-here", allow_unsafe=True))
    assert r.ok, r.to_text()


@pytest.mark.parametrize("policy", [SandboxPolicy(), SandboxPolicy(sandbox=False, allow_unsafe=True)],
                         ids=["bwrap", "unsafe"])
def test_reward_host_answers_in_both_modes(tmp_path, policy):
    from agent_trainer.inner_loop.spec.jobspec import RewardSpec
    from agent_trainer.inner_loop.isolation.reward_proxy import score_with_host

    if policy.sandbox and bwrap_problem() is not None:
        pytest.skip(f"bubblewrap unusable: {bwrap_problem()}")
    job = _file_reward_job(tmp_path)
    spec = RewardSpec.model_validate({"functions": [{"name": "mine", "source": "file"}, {"name": "exact_match"}]})
    request = {"prompts": ["a", "b"], "completions": ["1", "2"], "columns": {"answer": ["1", "3"]}}
    out = score_with_host(spec, job, request, timeout_s=30, policy=policy)
    assert out == {"values": {"mine": [1.0, 0.0], "exact_match": [1.0, 0.0]}, "errors": {}}
    missing = RewardSpec.model_validate({"functions": [{"name": "nope", "source": "file"}]})
    assert "defines no function 'nope'" in score_with_host(missing, job, request, 30, policy)["load_error"]
