"""Every cost an agent's data can cause is priced or refused before it runs (issue 54, item 2).

Each red-team file of the fourth outside red team, generated here (small versions where they prove the
same property fast), is paired with its price: the work it causes is at most a few times the price, or
the job is refused before training. Run: ``pytest tests/unit/test_agent_costs.py`` (``-m slow`` for the
full-size replays).
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from agent_trainer.inner_loop.models.registry import SHIPPED_DIR
from agent_trainer.inner_loop.spec.cost import (
    MAX_SEQUENCE_TOKENS, MAX_TOKEN_BYTES, _reference_tokenizer, row_tokens, token_counts,
)

OUTSIDE = "\U000F0041"   # a 4-byte character of a private use plane: outside every vocabulary, one token a byte
TASK = "examples/tasks/calc_chain_v1_fast.json"
needs_tiny_s = pytest.mark.skipif(not (SHIPPED_DIR / "tiny-s" / "config.json").is_file(),
                                  reason="needs the shipped tiny-s model")


def _long_rows(n: int, chars: int = 2000) -> list[dict]:
    """The probe attack's rows: prompts of ``chars`` 4-byte characters (4 tokens each), a short answer."""
    return [{"prompt": f"calc {i}: " + OUTSIDE * chars, "answer": str(i)} for i in range(n)]


def _job(folder, rows: list[dict], algorithm: str = "sft", max_steps: int = 10, **extra) -> "Path":
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "data.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    hp = {"max_steps": max_steps, "batch_size": 4, "learning_rate": 1e-4, **extra}
    job = {"base_model": "tiny-s", "algorithm": algorithm, "hyperparameters": hp, "data": {"file": "data.jsonl"},
           "seed": 0}
    if algorithm == "grpo":
        job["reward"] = {"functions": [{"name": "exact_match", "weight": 1.0}]}
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    return folder


def test_no_token_of_the_project_tokenizer_holds_more_than_max_token_bytes():
    tok = _reference_tokenizer()
    assert max(len(tok.decode([i]).encode()) for i in tok.get_vocab().values()) <= MAX_TOKEN_BYTES


def test_a_row_is_cut_before_it_is_tokenized_and_counts_as_the_trainer_cuts_it():
    text = "calc: " + "ab1+" * 5000                  # 20,000 characters, far more than 512 tokens
    assert row_tokens([{"prompt": text, "answer": "7"}]).row == MAX_SEQUENCE_TOKENS
    short = {"prompt": "calc: 3+4=", "answer": "7"}
    assert row_tokens([short]).row == token_counts(["calc: 3+4=7"])["calc: 3+4=7"]
    # A cut row counts what the uncut one would have, up to the trainer's cut: the cut is exact.
    encode = _reference_tokenizer().encode
    texts = ["word " * n for n in (100, 400, 511, 512, 513, 3000)] + [OUTSIDE * n for n in (100, 127, 128, 2000)]
    texts += ["\ufdfa" * n for n in (170, 171, 1000)] + ["ab" * 4096, "ab" * 4095 + "a"]
    for text in texts:
        whole = min(MAX_SEQUENCE_TOKENS, len(encode(text + "1", add_special_tokens=False).ids))
        assert row_tokens([{"prompt": text, "answer": "1"}]).row == whole


@needs_tiny_s
def test_the_divergence_probe_reads_rows_as_training_cuts_them():
    """32 rows of ~8,000 tokens: the probe's forward pass read them uncut (57.6 s priced 0.054 s); now 512 each."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_trainer.inner_loop.train.callbacks import probe_loss
    from agent_trainer.inner_loop.train.train import encode_probe, sft_ids

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR / "tiny-s")
    rows = _long_rows(32)
    ids, labels = encode_probe(tokenizer, rows)
    assert ids.shape == (32, MAX_SEQUENCE_TOKENS)
    assert (labels != -100).any()   # the loss stays defined when every answer lies past the cut
    short = [{"prompt": "calc: 3+4=", "answer": "7"}]
    ids_short, labels_short = encode_probe(tokenizer, short)
    assert ids_short[0].tolist() == sft_ids(tokenizer, ["calc: 3+4="], ["7"])[0][0]   # short rows as before
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR / "tiny-s")
    t0 = time.process_time()
    probe_loss(model, ids, labels)
    # What the cost model prices a 512-token row at; the probe reads 32 of them: a few steps of batch 16, not 1,000x.
    assert time.process_time() - t0 < 30


@needs_tiny_s
def test_the_grpo_dry_run_generates_from_prompts_cut_as_the_trainers_cut_rows():
    """The dry run generated from 4 prompts of ~6,000 tokens in the harness process (415 MB of its 919 MB peak on a
    1 MB U+FDFA file); it reads each prompt's last 512 tokens now, and prompts within the cut as before."""
    import torch
    from transformers import AutoTokenizer

    from agent_trainer.inner_loop.spec.probe import prompt_batch
    from agent_trainer.paths import cache_dir

    # The project's tokenizer, and a real BPE where SmolLM2 is imported.
    for folder in (SHIPPED_DIR / "tiny-s", cache_dir() / "models" / "smollm2-135m-v1"):
        if not (folder / "tokenizer.json").is_file():
            continue
        tok = AutoTokenizer.from_pretrained(folder)
        short = ["calc: 3+4=", "sort: 17 15 14 16 =", "x"]
        whole = tok(short, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        cut = prompt_batch(tok, short)
        assert set(cut) == set(whole) and all(torch.equal(cut[k], whole[k]) for k in whole)
        long = ["calc 1: " + "\ufdfa" * 1990 + " =", "calc: 1+1="]
        ids = prompt_batch(tok, long)["input_ids"]
        assert ids.shape == (2, MAX_SEQUENCE_TOKENS)
        end = tok(long[0][-100:], add_special_tokens=False)["input_ids"][-5:]
        assert ids[0, -5:].tolist() == end   # the prompt's end is kept: generation goes on from there


def test_counting_tokens_imports_no_torch():
    """The parsing child counts tokens with the project's tokenizer alone (importing the models package brought in
    torch and transformers: 6 of the child's 8 s on a small job)."""
    import subprocess
    import sys

    code = ("import sys; from agent_trainer.inner_loop.spec.cost import row_tokens; "
            "print(row_tokens([{'prompt': 'calc: 3+4=', 'answer': '7'}]).row, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [str(float(token_counts(["calc: 3+4=7"])["calc: 3+4=7"])), "False"], out


def test_the_cpu_seconds_of_a_whole_process_tree_are_counted(tmp_path):
    """The fault rule's evidence: a child and its grandchild spinning are both counted, load or not."""
    import sys

    from agent_trainer.inner_loop.isolation.launcher import kill_group, start, tree_cpu_seconds

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"
    code = (f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {spin!r}])\n{spin}p.wait()\n"
            "import time; time.sleep(30)\n")
    proc = start([sys.executable, "-I", "-c", code], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 60
        while tree_cpu_seconds(proc.pid) < 2.8 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert tree_cpu_seconds(proc.pid) >= 2.8   # 1.5 s each: the grandchild's, reaped, counted too
    finally:
        kill_group(proc.pid)
        proc.wait()


def test_a_kill_at_the_safety_cap_is_the_jobs_timeout_when_its_cpu_ran_far_past_its_price(tmp_path):
    """253 KB of 8,400-token rows priced at 20 s took ~500 CPU seconds by the 262 s cap: an ``infra_timeout``
    (retried, excluded: free) before; the job's ``timeout`` now. A job slowed by the machine's load is not."""
    from agent_trainer.evaluation.staged_reward import JobOutcome, staged_reward
    from agent_trainer.inner_loop.run.worker import JOB_FAULT_FACTOR, JOB_FAULT_MARGIN_S, final_status

    runaway = final_status(tmp_path, True, -9, 262.0, cpu_seconds=500.0, threads=2, expected_s=20.45)
    edge = JOB_FAULT_FACTOR * 2 * 20.45 + JOB_FAULT_MARGIN_S
    loaded = final_status(tmp_path, True, -9, 262.0, cpu_seconds=45.0, threads=2, expected_s=20.45)
    assert runaway["status"] == "timeout" and "CPU seconds" in runaway["detail"]
    assert final_status(tmp_path, True, -9, 262.0, cpu_seconds=edge - 1, threads=2, expected_s=20.45)["status"] \
        == "infra_timeout"
    assert loaded["status"] == "infra_timeout"
    assert final_status(tmp_path, True, -9, 262.0, cpu_seconds=1e6, threads=2)["status"] == "infra_timeout"  # no price
    assert final_status(tmp_path, True, -9, 262.0, cpu_seconds=edge + 1, threads=2, expected_s=20.45)["status"] \
        == "timeout"

    # One thread on a loaded machine: the whole tree got 70 CPU seconds, under the first rule's 3 x 18 + 60; the
    # trainer's log shows 19 steps priced 0.1 s each took 57.5 CPU seconds (main, the probe file, 05:28 UTC).
    log = [{"step": n, "seconds": 8.8 * n, "cpu_seconds": 57.5 * n / 19, "loss": 1.0} for n in range(1, 20)]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    steps = final_status(tmp_path, True, -9, 252.0, cpu_seconds=70.0, threads=1, expected_s=18.1,
                         stage_step_s=[0.1])
    assert steps["status"] == "timeout" and "19 steps took 58 CPU seconds" in steps["detail"], steps
    fair = [{**r, "cpu_seconds": 0.25 * r["step"]} for r in log]   # 0.25 CPU s a step: within 3 x 0.1 s
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fair))
    assert final_status(tmp_path, True, -9, 252.0, cpu_seconds=70.0, threads=1, expected_s=18.1,
                        stage_step_s=[0.1])["status"] == "infra_timeout"

    def reward(status):
        return staged_reward(0, JobOutcome(status=status, post_score=None, baseline=None, train_seconds=20.0,
                                           budget_seconds=90.0))
    assert reward("infra_timeout").excluded and not reward("timeout").excluded
    assert reward("timeout").job_success == 0.0 and reward("timeout").quality == 0.0


# The harness's side of a job up to training (Job.open, the validation with its dry run, then prepare: the
# contamination and reward-oracle checks), in a fresh interpreter: its peak RSS is the harness's own.
HARNESS_SIDE = """
import json, sys, time
from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy
from agent_trainer.inner_loop.run.job import Job, prepare, validate
from agent_trainer.inner_loop.run.request import JobRequest
from agent_trainer.inner_loop.run.result import JobResult

job_dir, out, task = sys.argv[1:4]
policy = SandboxPolicy(reward_timeout_s=10, sandbox_max_processes=32, reward_memory_gb=1).as_dict()
t0 = time.process_time()
job = Job.open(JobRequest.of(job_dir, task, out, sandbox=policy, cache=False, warm_workers=False, progress=False))
res = JobResult(status="invalid", task="t", family="calc_chain", job_dir=job_dir, output_dir=out, job_hash="",
                hidden_n=200)
ok = validate(job, res)
if ok:
    prepare(job, res)
# The process's own peak (VmHWM): ru_maxrss starts at the parent's peak across exec (the pytest worker's ~1.1 GB).
hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"rss_mb": hwm_kb / 1024,
                  "cpu_s": time.process_time() - t0, "ok": ok, "errors": [f.message for f in job.report.errors],
                  "check_seconds": job.report.probe.get("check_seconds"), "checks": res.checks}))
"""


PAST_THE_CUT = "the first 4 rows' answers lie past the 512-token cut of the trainers: such rows train nothing"


def _harness_side(job, out) -> dict:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HARNESS_SIDE, str(job), str(out), TASK], capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fill(size: int, row) -> list[dict]:
    """As many rows ``row(i)`` as fit in ``size`` bytes of JSONL."""
    one = len((json.dumps(row(0), ensure_ascii=False) + "\n").encode())
    return [row(i) for i in range(max(1, size // one))]


def _red_team_file(kind: str, size: int) -> tuple[list[dict], str]:
    if kind == "outside":   # 4-byte characters outside the vocabulary: one token a byte, ~24,000 tokens a row
        return _fill(size, lambda i: {"prompt": f"calc {i:05d}: " + OUTSIDE * 1980, "answer": OUTSIDE * 3990}), "sft"
    # GRPO prompts of U+FDFA (18 characters after NFKD, 3 tokens each)
    return _fill(size, lambda i: {"prompt": f"calc {i:05d}: " + "\ufdfa" * 1980, "answer": "1"}), "grpo"


def _red_team_job(folder, kind: str, size: int):
    rows, algorithm = _red_team_file(kind, size)
    job = _job(folder, rows, algorithm, **({"num_generations": 2} if algorithm == "grpo" else {}))
    if algorithm == "grpo":
        spec = yaml.safe_load((job / "job.yaml").read_text())
        spec["reward"] = {"file": "reward.py", "functions": [{"name": "r", "source": "file"}]}
        (job / "job.yaml").write_text(yaml.safe_dump(spec))
        (job / "reward.py").write_text("def r(prompts, completions, **kw):\n    return [0.0 for _ in prompts]\n")
    return job


@needs_tiny_s
@pytest.mark.parametrize("kind", ["outside", "fdfa"])
def test_a_red_team_file_costs_the_harness_under_1_gb_and_is_tokenized_in_the_child(kind, tmp_path):
    """1 MB versions (every data file takes the path of the 20 MB one) of the files that took the harness 3.1 GB and
    38 s (20 MB, outside the vocabulary) and 2.7 GB and 72 s (10 MB of U+FDFA, GRPO); the checks' limits by the
    job's size and their seconds in the result."""
    job = _red_team_job(tmp_path / "job", kind, 1_000_000)
    seen = _harness_side(job, tmp_path / "out")
    assert seen["ok"] or seen["errors"] == [PAST_THE_CUT], seen["errors"]   # SFT rows that train nothing: refused
    assert seen["check_seconds"]["parse"] > 0            # parsed and tokenized in the bounded child
    checks = seen["checks"]
    assert 0.9 < checks["mb"] < 1.0 and checks["cpu_limit_s"] == 40, checks   # 30 + 10 a MB + 0.5 a 1,000 rows
    assert set(checks["seconds"]) == ({"parse", "job", "oracle"} if seen["ok"] else {"parse"}), checks
    assert seen["rss_mb"] < 800 and seen["cpu_s"] < 60, seen


@pytest.mark.slow
@needs_tiny_s
@pytest.mark.parametrize("kind,size", [("outside", 19_900_000)])
def test_a_full_size_red_team_file_costs_the_harness_under_1_gb(kind, size, tmp_path):
    """The red team's own size: 20 MB outside the vocabulary (3.1 GB, 38 s before). Its 10 MB U+FDFA GRPO file
    takes the path of the 1.1 MB one above, and ~5 minutes of check children: its numbers are in
    docs/results/2026-12-07-red-team-rounds.md."""
    seen = _harness_side(_red_team_job(tmp_path / "job", kind, size), tmp_path / "out")
    assert seen["ok"] or seen["errors"] == [PAST_THE_CUT], seen["errors"]
    assert seen["rss_mb"] < 1024 and seen["cpu_s"] < 60, seen


@pytest.mark.slow
@needs_tiny_s
def test_the_probe_file_trains_within_a_few_times_its_price(tmp_path):
    """The red team's 253 KB file (32 rows of ~7,900-token answers), 31 steps: 138.6 s of training against 1.67 s
    priced (83x) with the probe uncut; now the training's CPU seconds (one thread, load-independent) stay within a
    few times its priced compute."""
    from agent_trainer.inner_loop.run.job import run_job

    rows = [{"prompt": f"calc {i:05d}: 3+4=", "answer": OUTSIDE * 1960} for i in range(32)]
    job = _job(tmp_path / "job", rows, max_steps=31)
    assert 240_000 < (job / "data.jsonl").stat().st_size < 256_000
    res = run_job(job, TASK, output_dir=tmp_path / "out", threads=1, cache=False, warm_workers=False, progress=False,
                  sandbox={"sandbox": False, "allow_unsafe": True})
    assert res.status == "ok" and res.steps == 31, (res.status, res.detail)
    log = [json.loads(line) for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["cpu_seconds"] < 5 * res.seconds["train_estimated"], (log[-1], res.seconds)
