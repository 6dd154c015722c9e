"""Property-based bad input: malformed job.yaml files, task specs, tool-call arguments and
Qwen3-style tool-call text thrown at the validators and tools (hypothesis, derandomized so CI
sees the same inputs every run).

What must hold for every input: the documented error type or a finding, never another exception;
the agent's tools answer ``ToolResult(ok=False)`` with a message (never the "<tool> failed: <Exception>"
line that marks a tool's own bug); nothing is written outside the workspace (and the harness-side
jobs folder); no file outside the workspace is read back to the agent. Each test counts the
inputs it ran, so the suite provably throws more than 1,000 of them.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent_trainer.evaluation.tasks import TaskSpec, TaskSpecError, load_task, parse_task
from agent_trainer.inner_loop.spec.jobspec import JobSpec, JobSpecError, load_job
from agent_trainer.inner_loop.spec.validate import ValidationReport, validate_job
from agent_trainer.outer_loop.agents.base import Generation, parse_tool_calls
from agent_trainer.outer_loop.episode.tools import SCHEMAS, ToolBox, ToolLimits, ToolResult
from agent_trainer.outer_loop.episode.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
TASK = load_task(ROOT / "examples/tasks/calc_chain_v1_tiny.json")
SECRET = "OUTSIDE-SECRET-7f3a"  # content of a file next to the workspace: must never reach the agent


def fuzz_settings(n: int):
    # No shrinking: a failure prints its input at once instead of minutes of shrinking in CI.
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# --- strategies -----------------------------------------------------------------------------

JOB_KEYS = ["base_model", "algorithm", "peft", "hyperparameters", "data", "reward", "seed", "sources", "family",
            "size", "weight", "file", "functions", "name", "source", "r", "alpha", "dropout", "target_modules",
            "learning_rate", "batch_size", "max_steps", "epochs", "num_generations", "max_completion_length",
            "temperature", "beta", "loss_type", "lr_scheduler", "warmup_ratio"]
TASK_KEYS = ["name", "family", "version", "instruction", "allowed_base_models", "budget", "max_steps",
             "max_seconds", "max_usd", "hidden_eval_size", "held_out"]
NASTY_STRINGS = ["tiny-s", "tiny-m", "tiny-agent", "qwen3-0.6b", "grpo", "sft", "calc_chain", "exact_match",
                 "numeric_closeness", "library", "file", "reward.py", "data.jsonl", "../data.jsonl", "/etc/passwd",
                 "~/x", "a\\b", "", " ", "nan", "inf", ".nan", "-.inf", "1e999", "0x10", "\x00", "\u2028", "é" * 50,
                 "x" * 5000, "../../outside/secret.txt", "sub/../../x", "link/secret.txt", "//", "./job.yaml"]
NUMBERS = st.one_of(st.integers(), st.integers(min_value=-2**80, max_value=2**80),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, -1, 1, 2, 7, 8, 64, 100_000, 100_001, 2**31, 2**63, 10**40, 1e-300, 1e308]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=40), st.sampled_from(NASTY_STRINGS))


def garbage(keys: list[str]):
    """Nested YAML/JSON-able values whose keys are mostly the schema's own (so validation goes deep)."""
    key = st.one_of(st.sampled_from(keys), st.text(max_size=12))
    return st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(key, inner, max_size=5)), max_leaves=24)


def _load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def _fit_tiny_task(node):
    """An example job shrunk to the tiny task's budget, so unmutated it validates and mutations go deep."""
    small = {"max_steps": 20, "batch_size": 16, "size": 200}
    if isinstance(node, dict):
        return {k: small[k] if k in small and isinstance(v, int) else _fit_tiny_task(v) for k, v in node.items()}
    return [_fit_tiny_task(v) for v in node] if isinstance(node, list) else node


VALID_JOBS = [_fit_tiny_task(_load_yaml(p)) for p in sorted((ROOT / "examples/jobs").glob("*/job.yaml"))]
EXAMPLE_DATA = (ROOT / "examples/jobs/custom_reward/data.jsonl").read_text()
EXAMPLE_REWARD = (ROOT / "examples/jobs/custom_reward/reward.py").read_text()
VALID_TASKS = [json.loads(p.read_text()) for p in sorted((ROOT / "examples/tasks").glob("*.json"))]


@st.composite
def mutated(draw, bases: list, keys: list[str]):
    """A valid document with 1-4 random edits: a value replaced by garbage, a key dropped or added."""
    doc = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(0, 4))):
        node = doc
        while True:  # walk down to a random container
            children = [v for v in (node.values() if isinstance(node, dict) else node) if isinstance(v, (dict, list))]
            if not children or draw(st.booleans()):
                break
            node = draw(st.sampled_from(children))
        op = draw(st.sampled_from(["set", "drop", "add", "nudge", "nudge"]))
        if isinstance(node, dict) and node and op in ("set", "drop", "nudge"):
            k = draw(st.sampled_from(sorted(node, key=str)))
            if op == "drop":
                del node[k]
            elif op == "nudge":  # same type, another value: most such jobs still parse and reach the deep checks
                node[k] = draw(_nudge(node[k], keys))
            else:
                node[k] = draw(garbage(keys))
        elif isinstance(node, list) and node and op == "set":
            node[draw(st.integers(0, len(node) - 1))] = draw(garbage(keys))
        elif isinstance(node, dict):
            node[draw(st.one_of(st.sampled_from(keys), st.text(max_size=10)))] = draw(garbage(keys))
        else:
            node.append(draw(garbage(keys)))
    return doc


def _nudge(value, keys: list[str]):
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(-3, 3 * max(1, abs(value))), st.sampled_from([0, 1, 2, 100_000, 2**31]))
    if isinstance(value, float):
        return st.one_of(st.floats(-1.0, 2 * max(1.0, abs(value))), st.sampled_from([0.0, 1e-12, 1e9]))
    if isinstance(value, str):
        return st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=12))
    return garbage(keys)


def as_yaml(doc) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode("utf-8", "surrogatepass")


YAML_TRICKS = [
    b"", b"---\n", b"~", b"[]", b"- a\n- b\n", b"just a sentence", b"\xff\xfe\x00\x01", b"\x00\x00",
    b"base_model: tiny-s\nbase_model: tiny-m\n", b"!!python/object/apply:os.system ['echo hi']\n",
    b"a: &a [1, 2]\nb: *a\n", b"a: *undefined\n", b"{{{{", b"key: 'unterminated\n", b"\tbase_model: tiny-s\n",
    b"seed: " + b"9" * 5000 + b"\n", b"seed: [" + b"[" * 3000 + b"]" * 3000 + b"]\n",
    b"data: " + b"{a: " * 2000 + b"1" + b"}" * 2000 + b"\n", b"seed: 1.0e999\nalgorithm: sft\n",
    b"hyperparameters: {learning_rate: .nan}\n", b"? [a, b]\n: c\n", b"%YAML 9.9\n---\na: 1\n",
    b"base_model: !!binary aGVsbG8=\n", b"seed: 2001-12-14\n", b"base_model: \xc3\x28\n",
]
MUTATED_JOB = st.builds(as_yaml, mutated(VALID_JOBS, JOB_KEYS))
OTHER_JOB_TEXT = st.one_of(
    st.builds(as_yaml, garbage(JOB_KEYS)),
    st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
    st.sampled_from(YAML_TRICKS),
)
# Mutated valid jobs 60% of the time: they get past the schema to the task, file and budget checks.
JOB_TEXT = st.integers(0, 9).flatmap(lambda i: MUTATED_JOB if i < 6 else OTHER_JOB_TEXT)
DATA_TEXT = st.one_of(
    st.just(EXAMPLE_DATA), st.builds(lambda n: EXAMPLE_DATA[:n], st.integers(0, len(EXAMPLE_DATA))),
    st.lists(st.builds(lambda d: json.dumps(d), garbage(["prompt", "answer", "family"])), max_size=6).map("\n".join),
    st.text(max_size=200), st.sampled_from(['{"prompt": "a", "answer": 1' + "1" * 5000 + "}",
                                            "[" * 50_000, '{"prompt": "p", "answer": "a"}\n' * 3]),
)
REWARD_TEXT = st.one_of(st.text(max_size=200), st.sampled_from(
    [EXAMPLE_REWARD, EXAMPLE_REWARD.replace("def ", "async def "),
     "def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n", "def (:", "\x00", "(" * 500,
     "import os\nos.system('touch /tmp/pwned')\n", "r = lambda *a, **k: 1\n"]))


# --- job.yaml and the static validation --------------------------------------------------------


def test_malformed_job_yaml_is_refused_with_findings_only(tmp_path):
    ran = []
    job = tmp_path / "job"
    job.mkdir()

    @fuzz_settings(400)
    @given(text=JOB_TEXT, data=st.none() | DATA_TEXT, reward=st.none() | REWARD_TEXT)
    def check(text, data, reward):
        ran.append(1)
        for name in os.listdir(job):
            (job / name).unlink()
        (job / "job.yaml").write_bytes(text)
        if data is not None:
            (job / "data.jsonl").write_text(data, errors="surrogatepass")
        if reward is not None:
            (job / "reward.py").write_text(reward, errors="surrogatepass")
        before = sorted(os.listdir(tmp_path)), sorted(os.listdir(job))
        try:
            spec = load_job(job, TASK.family)  # as validation reads it: a source without family is the task's
        except JobSpecError as e:
            spec = None
            assert str(e).strip()
        assert spec is None or isinstance(spec, JobSpec)
        if spec is not None:  # the harness hands the training process the spec as JSON
                              # (agent_trainer.inner_loop.run.worker)
            back = JobSpec.model_validate_json(spec.model_dump_json(exclude_unset=True),
                                               context={"task_family": TASK.family})
            assert back == spec
        report = validate_job(job, TASK, dry_run=False)
        assert isinstance(report, ValidationReport)
        internal = [f for f in report.findings if f.field == "<internal>"]
        assert not internal, (internal, report.probe.get("internal_traceback"))
        if spec is None:
            assert not report.ok and report.errors
        for f in report.findings:
            assert f.severity in ("error", "warning") and isinstance(f.message, str) and f.message
        assert report.to_text().startswith(f"job {job}")
        json.dumps(report.to_dict())
        assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(job))) == before, "validation wrote files"

    check()
    assert len(ran) >= 400


# --- task specs ----------------------------------------------------------------------------------

TASK_TEXT = st.one_of(
    st.builds(lambda d: json.dumps(d).encode(), mutated(VALID_TASKS, TASK_KEYS)),
    st.builds(lambda d: json.dumps(d).encode(), garbage(TASK_KEYS)),
    st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=200),
    st.sampled_from([b"", b"null", b"[]", b"{", b"\xff\xfe", b"[" * 100_000, b'{"name": ' + b"1" * 5000 + b"}",
                     b'{"name": "t", "family": "calc_chain", "budget": {"max_usd": NaN}}',
                     b'{"name": "t", "family": "calc_chain", "budget": {"max_seconds": Infinity}}',
                     b'{"name": "t", "family": "calc_chain", "hidden_eval_size": 1e400}']),
)


def test_malformed_task_specs_raise_task_spec_error_only(tmp_path):
    ran = []
    path = tmp_path / "task.json"

    @fuzz_settings(300)
    @given(text=TASK_TEXT)
    def check(text):
        ran.append(1)
        path.write_bytes(text)
        try:
            spec = load_task(path)
        except TaskSpecError as e:
            assert str(e).startswith("task spec") and "\n" not in str(e).strip()
            return
        assert isinstance(spec, TaskSpec)
        b = spec.budget
        for value in (b.max_seconds, b.max_usd):  # a NaN or infinite budget would disable the caps
            assert value == value and value not in (float("inf"), float("-inf"))
        assert parse_task(spec.model_dump()) == spec

    check()
    assert len(ran) >= 300


# --- the agent's tools -------------------------------------------------------------------------

TOOL_NAMES = [s["function"]["name"] for s in SCHEMAS]
ARG_KEYS = sorted({k for s in SCHEMAS for k in s["function"]["parameters"]["properties"]})
PATHS = st.one_of(
    st.sampled_from(["job.yaml", ".", "", "task.json", "GUIDE.md", "sub/job.yaml", "sub", "../outside/secret.txt",
                     "..", "/etc/passwd", "/tmp", "~", "~/x", "link", "link/secret.txt", "sub/../../outside",
                     "a\x00b", "a\\b", "x" * 300, "/".join(["d"] * 200), "é/ü.yaml", "job.yaml/", "./", "//x",
                     "\ud800.txt", "\udcff", "CON", " ", "\n"]),
    st.text(max_size=30),
)
ARG_VALUES = st.one_of(PATHS, SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), SCALARS,
                                                                                       max_size=3))
ARGUMENTS = st.one_of(
    st.dictionaries(st.sampled_from(ARG_KEYS), ARG_VALUES, max_size=3),
    st.dictionaries(st.one_of(st.sampled_from(ARG_KEYS), st.text(max_size=8)), ARG_VALUES, max_size=3),
    st.fixed_dictionaries({"path": PATHS, "content": st.one_of(st.text(max_size=200), st.builds(as_yaml, mutated(
        VALID_JOBS, JOB_KEYS)).map(lambda b: b.decode("utf-8", "surrogatepass")))}),
    st.builds(json.dumps, st.dictionaries(st.sampled_from(ARG_KEYS), ARG_VALUES, max_size=3)),
    st.text(max_size=60), st.none(), st.lists(SCALARS, max_size=3), NUMBERS, st.booleans(),
    st.sampled_from(['{"path": ' + "1" * 5000 + "}", "[" * 50_000, '{"path": "\\ud800"}', "null", "[]", '""']),
)


CONTENT = st.one_of(st.text(max_size=200), MUTATED_JOB.map(lambda b: b.decode("utf-8", "surrogatepass")),
                    st.sampled_from(["x" * 30_000, EXAMPLE_DATA, EXAMPLE_REWARD, "\x00\x01"]))
VALUES = {"path": PATHS, "content": CONTENT, "offset": st.one_of(st.integers(-5, 10_000), NUMBERS),
          "summary": st.one_of(st.text(max_size=60), st.just("s" * 20_000)),
          "model": st.one_of(st.sampled_from(["tiny-s", "tiny-m", "tiny-agent", "qwen3-0.6b", "../tiny-s", "/etc",
                                              "tiny-s/../../x", ""]), st.text(max_size=10)),
          "family": st.one_of(st.sampled_from(["calc_chain", "count_char", "triage", "../calc_chain", "nope", ""]),
                              st.text(max_size=10))}


def well_typed_call(name: str):
    """A call whose argument names and types are right and whose values are hostile (paths, sizes, names)."""
    params = next(s for s in SCHEMAS if s["function"]["name"] == name)["function"]["parameters"]
    props = params["properties"]
    args = st.fixed_dictionaries({k: VALUES[k] for k in params["required"]},
                                 optional={k: VALUES[k] for k in props if k not in params["required"]})
    return st.tuples(st.just(name), st.one_of(args, args.map(json.dumps)))


# 80% well-typed calls of real tools (they reach the tools' own code), 20% anything at all.
TOOL_CALL = st.integers(0, 9).flatmap(
    lambda i: st.sampled_from(TOOL_NAMES).flatmap(well_typed_call) if i < 8
    else st.tuples(st.one_of(st.sampled_from(TOOL_NAMES), st.text(max_size=12)), ARGUMENTS))


def _tree(root: Path, skip: set[Path]) -> dict[str, int]:
    """Every file under ``root`` (outside ``skip``) with its size: what a stray write would change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) not in skip]
        for f in filenames:
            p = Path(dirpath, f)
            out[str(p)] = p.lstat().st_size
    return out


def test_bad_tool_calls_answer_with_messages_and_stay_in_the_workspace(tmp_path, built_models):
    ran = []
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    ws = Workspace.create(tmp_path / "workspace", TASK, max_file_bytes=20_000, max_total_bytes=200_000)
    (ws.root / "link").symlink_to(outside, target_is_directory=True)
    (ws.root / "sub").mkdir()
    (ws.root / "job.yaml").write_bytes(as_yaml(VALID_JOBS[0]))
    jobs = tmp_path / "jobs"
    guarded = _tree(tmp_path, {ws.root, jobs})
    repo_top = sorted(os.listdir(ROOT))

    @fuzz_settings(350)
    @given(calls=st.lists(TOOL_CALL, min_size=1, max_size=4))
    def check(calls):
        ran.append(1)
        box = ToolBox(ws, TASK, limits=ToolLimits(max_turns=8, max_jobs_per_episode=2), jobs_dir=jobs, defer_jobs=True,
                      validate_kwargs={"dry_run": False}, compute_missing_baselines=False)
        for name, arguments in calls:
            res = box.call(name, arguments)
            assert isinstance(res, ToolResult) and isinstance(res.ok, bool) and isinstance(res.text, str)
            assert res.text and not res.text.startswith(f"{name} failed:"), res.text  # a tool's own bug
            assert SECRET not in res.text and SECRET not in json.dumps(res.data, default=str)
            assert len(res.text) <= box.limits.max_result_chars + 100
        assert _tree(tmp_path, {ws.root, jobs}) == guarded, "a file outside the workspace changed"
        for p in jobs.rglob("*") if jobs.exists() else ():
            rel = p.relative_to(jobs).parts
            assert not p.is_symlink() and (len(rel) == 1 or rel[1] == "job"), p  # snapshots only
        assert (outside / "secret.txt").read_text() == SECRET

    check()
    assert sorted(os.listdir(ROOT)) == repo_top, "a tool wrote into the working directory"
    assert len(ran) >= 350


# --- Qwen3 tool-call text, as the local backend parses it ---------------------------------------

FRAGMENTS = st.one_of(
    st.sampled_from(["<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>", '{"name": "write_file", ',
                     '"arguments": {"path": "job.yaml", "content": "x"}}', '{"name": ', '"arguments": "', "}",
                     '{"name": "read_file", "arguments": "{\\"path\\": \\"../outside/secret.txt\\"}"}',
                     '{"name": "finish"}', '{"name": "", "arguments": {}}', '{"name": 1, "arguments": {}}',
                     '{"name": "x", "arguments": []}', '{"name": "x", "arguments": "' + "[" * 5000 + '"}',
                     '{"name": "x", "arguments": "{\\"a\\": ' + "1" * 5000 + '}"}', "[" * 20_000,
                     '{"name": "write_file", "arguments": {"path": "\\ud800", "content": "\\udfff"}}',
                     "<|im_end|>", "<think>", "</think>", "\x00", "\u2028"]),
    st.builds(lambda name, args: json.dumps({"name": name, "arguments": args}),
              st.one_of(st.sampled_from(TOOL_NAMES), st.text(max_size=8)), ARGUMENTS),
    st.text(max_size=40),
)
# A whole block as the model writes it (arguments as an object or a JSON string, closing tag optional).
BLOCK = st.builds(lambda call, as_text, close: "<tool_call>\n" + json.dumps(
    {"name": call[0], "arguments": json.dumps(call[1]) if as_text and not isinstance(call[1], str) else call[1]})
    + ("\n</tool_call>" if close else ""), TOOL_CALL, st.booleans(), st.booleans())
TEXT_PARTS = st.integers(0, 9).flatmap(lambda i: BLOCK if i < 5 else FRAGMENTS)


def test_tool_call_text_parses_to_calls_or_content_never_an_exception(tmp_path, built_models):
    ran = []
    ws = Workspace.create(tmp_path / "workspace", TASK, max_file_bytes=20_000, max_total_bytes=200_000)
    jobs = tmp_path / "jobs"

    @fuzz_settings(350)
    @given(parts=st.lists(TEXT_PARTS, max_size=6))
    def check(parts):
        ran.append(1)
        text = "".join(parts)
        content, calls = parse_tool_calls(text)
        assert isinstance(content, str) and isinstance(calls, list)
        if not calls:
            assert content == text.strip()
        for c in calls:
            assert isinstance(c["name"], str) and c["name"] and isinstance(c["arguments"], dict)
            assert isinstance(c["id"], str) and c["id"].startswith("call_")
        assert len({c["id"] for c in calls}) == len(calls)
        msg = Generation(text=content, tool_calls=calls).as_message()
        # the message goes back into the chat template and the trajectory file: it must encode
        json.dumps(msg).encode("utf-8")
        for tc in msg.get("tool_calls", []):
            assert isinstance(json.loads(tc["function"]["arguments"].encode("utf-8")), dict)
        box = ToolBox(ws, TASK, limits=ToolLimits(max_turns=8, max_jobs_per_episode=1), jobs_dir=jobs, defer_jobs=True,
                      validate_kwargs={"dry_run": False}, compute_missing_baselines=False)
        for c in calls:
            res = box.call(c["name"], c["arguments"])
            assert isinstance(res, ToolResult) and not res.text.startswith(f"{c['name']} failed:"), res.text

    check()
    assert len(ran) >= 350


@pytest.mark.parametrize("line", ['{"prompt": "calc: 1+1=", "answer": ' + "1" * 5000 + "}", "[" * 100_000,
                                  '{"prompt": "p", "answer": NaN}', '{"prompt": "\\ud800", "answer": "2"}', "[]",
                                  '{"prompt": "p", "answer": "a", "family": "nope"}', "\x00", '"just a string"'])
def test_bad_data_lines_are_findings(tmp_path, line):
    job = copy.deepcopy(next(j for j in VALID_JOBS if j["data"].get("file")))
    (tmp_path / "job.yaml").write_bytes(as_yaml(job))
    (tmp_path / "reward.py").write_text(EXAMPLE_REWARD)
    (tmp_path / "data.jsonl").write_text(EXAMPLE_DATA + line + "\n")
    report = validate_job(tmp_path, TASK, dry_run=False)
    assert [f.field for f in report.errors] == ["data.file"], report.to_text()
    assert "line 301" in report.errors[0].message


@pytest.mark.parametrize("text", ["<tool_call>" + "[" * 200_000 + "</tool_call>",
                                  '<tool_call>{"name": "a", "arguments": "' + "[" * 200_000 + '"}</tool_call>'])
def test_pathological_nesting_is_no_call(text):
    content, calls = parse_tool_calls(text)
    assert calls == [] and content == text.strip()


def test_deeply_nested_files_are_findings(tmp_path):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        (Path(d) / "job.yaml").write_text("data: " + "[" * 20_000 + "]" * 20_000 + "\n")
        t0 = time.monotonic()
        with pytest.raises(JobSpecError, match="nested"):
            load_job(d)
        report = validate_job(d, TASK, dry_run=False)
        assert not report.ok and report.errors[0].field == "job.yaml"
        assert time.monotonic() - t0 < 1.0, "refused before PyYAML's quadratic scan of deep nesting"
