"""The warm start of a pretrained agent (agent_trainer.outer_loop.agents.agent_warm_start): which transcripts, in which
format."""

from __future__ import annotations

import json

import pytest

from agent_trainer.outer_loop.agents.agent_warm_start import WARM_STARTS, invalid_writes, resolve_agent, successful


def test_only_episodes_whose_last_validation_passed_are_kept():
    def episode(*results):
        return [{"role": "tool", "name": "validate_job", "content": r} for r in results]

    assert successful(episode("job .: INVALID (1 errors, 0 warnings)", "job .: VALID (0 errors, 2 warnings)"))
    assert not successful(episode("job .: VALID (0 errors, 0 warnings)", "job .: INVALID (2 errors, 0 warnings)"))
    assert not successful([{"role": "tool", "name": "write_file", "content": "wrote job.yaml"}])


def _call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": name, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _tool(name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": name, "name": name, "content": content}


FIXED = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
         _call("write_file", path="job.yaml", content="algorithm: grpo\n"), _tool("write_file", "wrote"),
         _call("validate_job", path="job.yaml"), _tool("validate_job", "job .: INVALID (1 errors, 0 warnings)"),
         _call("write_file", path="job.yaml", content="algorithm: sft\n"), _tool("write_file", "wrote"),
         _call("validate_job", path="job.yaml"), _tool("validate_job", "job .: VALID (0 errors, 0 warnings)"),
         _call("submit_job", path="job.yaml")]


def test_the_writes_validation_refused_are_found():
    """Only the write the next validation called INVALID: not the validate call, not the fix, not the submission."""
    assert invalid_writes(FIXED) == {2}
    assert invalid_writes(FIXED[:2] + FIXED[6:]) == set()
    # a write no validation followed is not judged
    assert invalid_writes(FIXED[:4]) == set()


def test_a_refused_write_is_context_not_a_target():
    """learn_invalid_writes=False: the novice's invalid file stays in the transcript (the fix follows from the
    validator's message) but none of its tokens is a target; every other assistant turn is one, unchanged."""
    from agent_trainer.inner_loop.models import build_tokenizer
    from agent_trainer.outer_loop.agents.agent_model import encode_transcript

    tok = build_tokenizer()
    ids, mask = encode_transcript(FIXED, tok, None)
    quiet_ids, quiet = encode_transcript(FIXED, tok, None, context_only=frozenset(invalid_writes(FIXED)))
    assert quiet_ids == ids
    targets = tok.decode([t for t, m in zip(ids, mask) if m])
    kept = tok.decode([t for t, m in zip(ids, quiet) if m])
    assert "grpo" in targets and "grpo" not in kept and "sft" in kept
    assert kept.count("<|im_end|>") == targets.count("<|im_end|>") - 1 == 4
    assert all(q <= m for q, m in zip(quiet, mask))


def test_the_valid_warm_start_is_the_same_recipe_without_the_mistakes():
    """smollm2-agent-valid changes only what its docs say: transcripts, epochs, invalid writes not learned."""
    import dataclasses

    a, b = WARM_STARTS["smollm2-agent"], WARM_STARTS["smollm2-agent-valid"]
    assert a.learn_invalid_writes and not b.learn_invalid_writes
    assert dataclasses.replace(b, n_transcripts=a.n_transcripts, epochs=a.epochs, learn_invalid_writes=True) == a


def test_other_names_are_the_registrys():
    from agent_trainer.inner_loop.models.registry import ModelNotFoundError

    assert WARM_STARTS["smollm2-agent"].base == "smollm2-135m"
    with pytest.raises(ModelNotFoundError, match="known models: .*smollm2-135m"):
        resolve_agent("no-such-agent")


def test_warm_start_transcripts_are_what_the_backend_renders(smollm2):
    """The warm start of a pretrained agent trains on the tokens the local backend would sample after its prompt."""
    path = smollm2
    from transformers import AutoTokenizer

    from agent_trainer.outer_loop.agents.agent_warm_start import WarmStart, transcripts

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    (ids, mask), = transcripts(tok, WarmStart(base="smollm2-135m", n_transcripts=1))
    first = mask.index(1)
    prompt = tok.decode(ids[:first])
    assert prompt.endswith("<|im_start|>assistant\n") and "# Tools" in prompt and '"name": "submit_job"' in prompt
    turn = tok.decode(ids[first:mask.index(0, first)])
    assert turn.startswith("<tool_call>\n{") and turn.endswith("</tool_call><|im_end|>")
    assert len(ids) == len(mask) and sum(mask) < len(ids) / 2


def tiny_base(tokenizer_dir, folder):
    """A random 1-layer Llama with ``tokenizer_dir``'s tokenizer (its chat template): a warm start in seconds."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192)
                     ).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_building_a_warm_start_shows_progress_also_in_a_log(smollm2, tmp_path, monkeypatch):
    """A warm start takes minutes to an hour on a CPU: a tqdm bar over the transcripts played, then one over the
    training steps, each to its total; into a log (stderr is not a terminal under pytest) at most once a minute;
    never with progress=False."""
    import io

    import tqdm.auto

    from agent_trainer.outer_loop.agents.agent_warm_start import WarmStart, warm_start

    bars = []

    class Recorded(tqdm.auto.tqdm):
        def __init__(self, *args, disable=False, **kwargs):
            self.asked, self.every = disable, kwargs.pop("mininterval", None)   # what it asks, recorded;
            super().__init__(*args, disable=False, file=io.StringIO(), mininterval=0, **kwargs)   # drawn each time
            if self.desc in ("novice transcripts", "warm start training"):   # not transformers' own bars
                bars.append(self)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    base = tiny_base(smollm2, tmp_path / "base")
    cfg = WarmStart(base="smollm2-135m", n_transcripts=2, epochs=2)
    info = warm_start(base, tmp_path / "on", cfg)
    assert [(b.desc, b.unit, b.n, b.total, b.asked, b.every) for b in bars] == [
        ("novice transcripts", "transcript", 2, 2, False, 60.0), ("warm start training", "step", 4, 4, False, 60.0)]
    assert info["transcripts"] == 2 and "loss=" in bars[1].fp.getvalue()

    bars.clear()
    warm_start(base, tmp_path / "off", cfg, progress=False)
    assert [b.asked for b in bars] == [True, True]
    assert (tmp_path / "on" / "model.safetensors").read_bytes() == (tmp_path / "off" / "model.safetensors").read_bytes()
