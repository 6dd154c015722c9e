"""The tiny agent's warm start: novice transcripts, their encoding and the novice's prior (no model is built)."""

from __future__ import annotations

import collections
import json
import random

import pytest
import yaml

from agent_trainer.inner_loop.models import build_tokenizer
from agent_trainer.inner_loop.spec.validate import validate_job
from agent_trainer.outer_loop.agents.agent_model import encode_transcript, training_tasks
from agent_trainer.outer_loop.episode.episode import opening_messages
from agent_trainer.outer_loop.agents.novice import (
    INVALID_PROB, MISTAKES, break_job, novice_episode, render_job, sample_job,
)

EOT = "<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def tasks():
    return training_tasks()


def _validate(job: dict, task, tmp_path, name: str) -> bool:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "job.yaml").write_text(render_job(job))
    return validate_job(folder, task, dry_run=False).ok


def _scripted_transcript(task, rng, tmp_path) -> list[dict]:
    """A novice conversation with the real validator's verdicts and fixed tool texts (no toolbox, no baselines)."""
    messages = opening_messages(task, "names")
    script = novice_episode(task, rng)
    result, written = None, ""
    for i in range(32):
        call = script.send(result) if i else next(script)
        cid = f"call_{i}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]})
        if call["name"] == "submit_job":
            return messages
        if call["name"] == "write_file":
            written = call["arguments"]["content"]
        result = None
        if call["name"] == "validate_job":
            result = {"ok": _validate(yaml.safe_load(written), task, tmp_path, f"v{i}")}
        messages.append({"role": "tool", "tool_call_id": cid, "name": call["name"], "content": f"result {i}: {result}"})
    raise AssertionError("the novice never submitted")


def test_assistant_mask_covers_exactly_the_assistant_turns(tok, tasks, tmp_path):
    rng = random.Random(3)
    for k, task in enumerate(tasks[:4]):
        messages = _scripted_transcript(task, rng, tmp_path / str(k))
        ids, mask = encode_transcript(messages, tok, None)
        assert len(ids) == len(mask) and set(mask) <= {0, 1}
        # the ids are the whole conversation as the chat template renders it
        full = tok.apply_chat_template(messages, tools=None, add_generation_prompt=False, tokenize=False)
        assert tok.decode(ids, skip_special_tokens=False) == full
        # one masked run per assistant turn, each exactly that turn's sampled text (ending with <|im_end|>)
        runs, start = [], None
        for i, m in enumerate(mask + [0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                runs.append((start, i))
                start = None
        turns = [m for m in messages if m["role"] == "assistant"]
        assert len(runs) == len(turns)
        for (a, b), turn in zip(runs, turns):
            text = tok.decode(ids[a:b], skip_special_tokens=False)
            f = turn["tool_calls"][0]["function"]
            assert text.startswith("<tool_call>\n") and text.endswith("</tool_call>" + EOT)
            body = json.loads(text[len("<tool_call>\n"): -len("\n</tool_call>" + EOT)])
            assert body == {"name": f["name"], "arguments": json.loads(f["arguments"])}
            assert tok.decode(ids[:a], skip_special_tokens=False).endswith("<|im_start|>assistant\n")
        # nothing else is trained on: the system, user and tool texts are all context
        assert sum(mask) == sum(b - a for a, b in runs)


def test_novice_jobs_are_valid_and_each_mistake_breaks_them(tasks, tmp_path):
    rng = random.Random(0)
    for k, task in enumerate(tasks):
        job = sample_job(task, rng)
        assert yaml.safe_load(render_job(job)) == job  # the compact flow-style text round-trips
        assert "family" not in render_job(job)  # the task's own data: the same text on every task, held-out too
        assert _validate(job, task, tmp_path, f"ok{k}")
        for mistake in MISTAKES:
            bad = break_job(job, mistake, task)
            assert not _validate(bad, task, tmp_path, f"bad{k}_{mistake}"), mistake


def test_novice_prior_is_mixed_in_the_expected_proportions(tasks, tmp_path):
    rng = random.Random(1)
    n = 160
    first_valid, fixed, submitted = 0, 0, 0
    choices = collections.Counter()
    for i in range(n):
        task = tasks[i % len(tasks)]
        messages = _scripted_transcript(task, rng, tmp_path / str(i))
        calls = [m["tool_calls"][0]["function"] for m in messages if m["role"] == "assistant"]
        submitted += calls[-1]["name"] == "submit_job"
        verdicts = [m["content"].endswith("{'ok': True}") for m in messages
                    if m["role"] == "tool" and m["name"] == "validate_job"]
        first_valid += verdicts[0]
        fixed += (not verdicts[0]) and verdicts[-1]
        job = yaml.safe_load(json.loads(calls[[c["name"] for c in calls].index("write_file")]["arguments"])["content"])
        choices[job["base_model"]] += 1
        choices[job["algorithm"]] += 1
        choices[job["hyperparameters"].get("learning_rate")] += 1
    assert submitted == n
    assert abs(first_valid / n - (1 - INVALID_PROB)) < 0.12  # about half the first jobs are invalid
    assert 0 < fixed < n - first_valid                        # some, not all, invalid jobs get fixed
    assert choices["tiny-s"] > choices["tiny-m"] > 0.1 * n    # mostly the small model, not only
    assert min(choices["sft"], choices["grpo"]) > 0.3 * n
    assert sum(1 for c in choices if isinstance(c, float)) >= 5  # a spread of learning rates
