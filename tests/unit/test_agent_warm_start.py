"""The warm start of a pretrained agent (outer_loop.agent_warm_start): which transcripts, in which format."""

from __future__ import annotations

import pytest

from outer_loop.agent_warm_start import WARM_STARTS, resolve_agent, successful


def test_only_episodes_whose_last_validation_passed_are_kept():
    def episode(*results):
        return [{"role": "tool", "name": "validate_job", "content": r} for r in results]

    assert successful(episode("job .: INVALID (1 errors, 0 warnings)", "job .: VALID (0 errors, 2 warnings)"))
    assert not successful(episode("job .: VALID (0 errors, 0 warnings)", "job .: INVALID (2 errors, 0 warnings)"))
    assert not successful([{"role": "tool", "name": "write_file", "content": "wrote job.yaml"}])


def test_other_names_are_the_registrys():
    from inner_loop.models.registry import ModelNotFoundError

    assert WARM_STARTS["smollm2-agent"].base == "smollm2-135m"
    with pytest.raises(ModelNotFoundError, match="known models: .*smollm2-135m"):
        resolve_agent("no-such-agent")


def test_warm_start_transcripts_are_what_the_backend_renders(smollm2):
    """The warm start of a pretrained agent trains on the tokens the local backend would sample after its prompt."""
    path = smollm2
    from transformers import AutoTokenizer

    from outer_loop.agent_warm_start import WarmStart, transcripts

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    (ids, mask), = transcripts(tok, WarmStart(base="smollm2-135m", n_transcripts=1))
    first = mask.index(1)
    prompt = tok.decode(ids[:first])
    assert prompt.endswith("<|im_start|>assistant\n") and "# Tools" in prompt and '"name": "submit_job"' in prompt
    turn = tok.decode(ids[first:mask.index(0, first)])
    assert turn.startswith("<tool_call>\n{") and turn.endswith("</tool_call><|im_end|>")
    assert len(ids) == len(mask) and sum(mask) < len(ids) / 2
