"""The warm start of a pretrained agent (agent_trainer.outer_loop.agents.agent_warm_start): which transcripts, in which
format."""

from __future__ import annotations

import pytest

from agent_trainer.outer_loop.agents.agent_warm_start import WARM_STARTS, resolve_agent, successful


def test_only_episodes_whose_last_validation_passed_are_kept():
    def episode(*results):
        return [{"role": "tool", "name": "validate_job", "content": r} for r in results]

    assert successful(episode("job .: INVALID (1 errors, 0 warnings)", "job .: VALID (0 errors, 2 warnings)"))
    assert not successful(episode("job .: VALID (0 errors, 0 warnings)", "job .: INVALID (2 errors, 0 warnings)"))
    assert not successful([{"role": "tool", "name": "write_file", "content": "wrote job.yaml"}])


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


def test_building_a_warm_start_shows_progress_on_a_terminal(smollm2, tmp_path, monkeypatch):
    """A warm start takes minutes on a CPU: a tqdm bar over the transcripts played, then one over the training
    steps, each to its total; drawn on a terminal only (tqdm's disable=None), never with progress=False."""
    import io

    import tqdm.auto

    from agent_trainer.outer_loop.agents.agent_warm_start import WarmStart, warm_start

    bars = []

    class Recorded(tqdm.auto.tqdm):
        def __init__(self, *args, disable=False, **kwargs):
            self.asked = disable                     # counted whatever it asks, into a buffer
            super().__init__(*args, disable=False, file=io.StringIO(), **kwargs)
            if self.desc in ("novice transcripts", "warm start training"):   # not transformers' own bars
                bars.append(self)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    base = tiny_base(smollm2, tmp_path / "base")
    cfg = WarmStart(base="smollm2-135m", n_transcripts=2, epochs=2)
    info = warm_start(base, tmp_path / "on", cfg)
    assert [(b.desc, b.unit, b.n, b.total, b.asked) for b in bars] == [
        ("novice transcripts", "transcript", 2, 2, None), ("warm start training", "step", 4, 4, None)]
    assert info["transcripts"] == 2 and "loss=" in bars[1].fp.getvalue()

    bars.clear()
    warm_start(base, tmp_path / "off", cfg, progress=False)
    assert [b.asked for b in bars] == [True, True]
    assert (tmp_path / "on" / "model.safetensors").read_bytes() == (tmp_path / "off" / "model.safetensors").read_bytes()
