"""Sampling a step's turns together: the local backend's padded batch gives each row the tokens and log-probs
it gets alone, and episodes played together (``play_together``) are the episodes played one by one.

A tiny, untrained Qwen3 with the project tokenizer (built in memory): its turns are noise, which is what a
test of the sampler wants (long, varied completions that stop at different steps).
"""

from __future__ import annotations

import pytest
import torch

from agent_trainer.outer_loop.agents.base import SampleRequest


@pytest.fixture(scope="module")
def backend():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer
    from agent_trainer.outer_loop.agents.local import LocalBackend

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                      max_position_embeddings=1024, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LocalBackend(Qwen3ForCausalLM(cfg), tok, device="cpu", model_name="tiny")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def plain(backend):
    """The same model sampled as before: one sequence at a time, every prompt run whole (no stored prefixes)."""
    from agent_trainer.outer_loop.agents.local import LocalBackend

    return LocalBackend(backend.model, backend.tokenizer, device="cpu", model_name="tiny", prefix_cache_tokens=0)


def _requests() -> list[SampleRequest]:
    """Conversations of different lengths, temperatures and budgets (rows leave the batch at different steps)."""
    convs = [[{"role": "user", "content": "Train a model."}],
             [{"role": "system", "content": "You write jobs."},
              {"role": "user", "content": "Post-train tiny-s on calc_chain: " + "a+b=c " * 30}],
             [{"role": "user", "content": "sort: 3 1 2"}, {"role": "assistant", "content": "1 2 3"},
              {"role": "user", "content": "again, with 9 8 7 and a longer message " * 5}]]
    return [SampleRequest(convs[0], None, 1.0, 40, 11), SampleRequest(convs[1], None, 0.7, 7, 12),
            SampleRequest(convs[2], None, 1.0, 25, 13), SampleRequest(convs[1], None, 0.0, 16, 14)]


def test_batched_sampling_equals_one_by_one(backend, plain):
    requests = _requests()
    backend.forget()
    alone = [plain.generate(r.messages, r.tools, temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                              seed=r.seed) for r in requests]
    together = backend.generate_batch(requests)
    assert len({len(g.token_ids) for g in alone}) > 1, "rows should stop at different steps"
    for a, b, r in zip(alone, together, requests):
        assert b.token_ids == a.token_ids and b.prompt_ids == a.prompt_ids
        assert len(b.token_ids) <= r.max_new_tokens
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5)
        assert (b.text, b.finish_reason, b.completion_tokens) == (a.text, a.finish_reason, a.completion_tokens)


def test_batched_logprobs_are_the_policy_logprobs(backend):
    """What the batch returns is log_softmax(logits / T) of the model on prompt + tokens, without padding."""
    r = _requests()[0]
    gen = backend.generate_batch(_requests())[0]
    ids = torch.tensor([gen.prompt_ids + gen.token_ids])
    with torch.no_grad():
        logits = backend.model(ids).logits[0, len(gen.prompt_ids) - 1:-1].float() / r.temperature
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    assert torch.allclose(want, torch.tensor(gen.logprobs), atol=1e-5)


def test_a_row_that_cannot_be_sampled_gets_its_error(backend):
    from agent_trainer.outer_loop.agents.base import BackendError

    good, = _requests()[:1]
    long = SampleRequest([{"role": "user", "content": "x " * 2000}], None, 1.0, 5, 1)
    out = backend.generate_batch([good, long, SampleRequest(good.messages, None, -1.0, 5, 1)])
    assert out[0].token_ids and isinstance(out[1], BackendError) and "context" in str(out[1])
    assert isinstance(out[2], BackendError) and "temperature" in str(out[2])


def test_max_batch_splits_rows_without_changing_them(backend):
    requests = _requests()
    whole = backend.generate_batch(requests)
    backend.max_batch = 2
    try:
        split = backend.generate_batch(requests)
    finally:
        backend.max_batch = 16
    assert [g.token_ids for g in split] == [g.token_ids for g in whole]


def test_episodes_played_together_are_the_episodes_played_alone(backend, plain, tmp_path):
    """Rounds of batched turns (``play_together``) give every episode the conversation, tokens and status it
    has when played alone; ``on_end`` hears of each episode once, as it ends."""
    from pathlib import Path

    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.config import AgentConfig, ToolSchemas
    from agent_trainer.outer_loop.episode.episode import Episode, EpisodeSettings, play_together

    task = load_task(Path(__file__).resolve().parents[2] / "examples/tasks/calc_chain_v1_tiny.json")
    settings = [EpisodeSettings(AgentConfig(max_turns=t, max_new_tokens=n, temperature=1.0,
                                            tool_schemas=ToolSchemas.names))
                for t, n in ((2, 12), (3, 6), (1, 20))]

    def episodes(folder, agent):
        return [Episode(agent, task, tmp_path / folder / str(i), settings=s, seed=100 + i)
                for i, s in enumerate(settings)]

    alone = episodes("alone", plain)
    for ep in alone:
        ep.play()
    ended: list[str] = []
    backend.forget()
    together = episodes("together", backend)
    play_together(together, on_end=lambda ep: ended.append(ep.id))
    assert sorted(ended) == sorted(ep.id for ep in together) and len(ended) == 3
    for a, b in zip(alone, together):
        assert b.status == a.status == "max_turns"
        assert b.messages == a.messages
        assert [t.completion_ids for t in b.turns] == [t.completion_ids for t in a.turns]
        assert b.tokens_in == a.tokens_in and b.tokens_out == a.tokens_out


def test_later_turns_start_from_the_stored_prefix(backend, plain):
    """A conversation's next turn runs only its new tokens (the earlier turn's keys and values are kept), and
    samples what a whole-prompt run samples; forget() drops what was kept."""
    backend.forget()
    msgs = [{"role": "user", "content": "Post-train tiny-s on calc_chain: " + "a+b=c " * 20}]
    first = backend.generate(msgs, None, temperature=1.0, max_new_tokens=12, seed=5)
    assert len(backend.prefixes) >= 1
    later = msgs + [first.as_message(), {"role": "user", "content": "and now sort 3 1 2"}]
    prompt = backend.render(later, None)
    _, reused = backend.prefixes.longest(prompt)
    assert reused >= len(first.prompt_ids)                    # the whole first turn's prompt is not run again
    again = backend.generate(later, None, temperature=1.0, max_new_tokens=12, seed=6)
    whole = plain.generate(later, None, temperature=1.0, max_new_tokens=12, seed=6)
    assert again.token_ids == whole.token_ids
    assert torch.allclose(torch.tensor(again.logprobs), torch.tensor(whole.logprobs), atol=1e-5)
    backend.forget()
    assert len(backend.prefixes) == 0


def test_a_step_shares_its_common_prompt_once(backend):
    """The first turns of a batch share their system prompt: it is run once, not once a row."""
    backend.forget()
    system = {"role": "system", "content": "You write jobs. " * 15}
    reqs = [SampleRequest([system, {"role": "user", "content": f"task {i}"}], None, 1.0, 4, i) for i in range(3)]
    prompts = [backend.render(r.messages, None) for r in reqs]
    shared = min(len(p) for p in prompts) - 1
    while len({tuple(p[:shared]) for p in prompts}) > 1:
        shared -= 1
    fed: list[int] = []
    hook = backend.model.register_forward_pre_hook(
        lambda mod, args, kwargs: fed.append(int((kwargs["attention_mask"][:, -kwargs["input_ids"].shape[1]:]
                                                  > 0).sum())), with_kwargs=True)
    try:
        out = backend.generate_batch(reqs)
    finally:
        hook.remove()
    sampled = sum(len(g.token_ids) for g in out)
    assert shared > 20
    assert sum(fed) <= shared + sum(len(p) - shared for p in prompts) + sampled



def test_the_growing_cache_decodes_as_transformers_dynamic_cache_without_copying(backend):
    """The batch's KV cache (``growing_cache``) gives the logits of transformers' ``DynamicCache`` step for step,
    rows leaving included, and a decode step writes into its buffer instead of reallocating every layer."""
    from transformers import DynamicCache

    from agent_trainer.outer_loop.agents.local import _cache_kw
    from agent_trainer.outer_loop.agents.prefix_cache import growing_cache

    model, kw = backend.model, _cache_kw()
    torch.manual_seed(1)
    with torch.no_grad():
        out = model(input_ids=torch.randint(5, 200, (3, 20)), use_cache=True)
        kv = [(k.clone(), v.clone()) for k, v, *_ in getattr(out, kw)]
        ours, theirs = growing_cache(kv), DynamicCache(kv)
        # Buffers handed over with room behind their 20 filled positions are used as they are, not copied.
        given = [(torch.cat([k, torch.zeros_like(k)], dim=2), torch.cat([v, torch.zeros_like(v)], dim=2)) for k, v in kv]
        held = growing_cache(given, filled=20)
        assert [layer._k.data_ptr() for layer in held.layers] == [k.data_ptr() for k, _ in given]
        rows, attn = 3, torch.ones(3, 21, dtype=torch.long)
        buffers = [layer._k.data_ptr() for layer in ours.layers]
        for step in range(6):
            if step == 3:                                    # a row leaves the batch
                keep = torch.tensor([0, 2])
                ours.batch_select_indices(keep)
                theirs.batch_select_indices(keep)
                held.batch_select_indices(keep)
                attn, rows = attn[keep], 2
                buffers = [layer._k.data_ptr() for layer in ours.layers]
            nxt = torch.arange(rows).view(-1, 1) + 7 + step
            a = model(input_ids=nxt, attention_mask=attn, use_cache=True, **{kw: ours})
            b = model(input_ids=nxt, attention_mask=attn, use_cache=True, **{kw: theirs})
            c = model(input_ids=nxt, attention_mask=attn, use_cache=True, **{kw: held})
            assert torch.equal(a.logits, b.logits) and torch.equal(c.logits, b.logits)
            assert [layer._k.data_ptr() for layer in ours.layers] == buffers, "a decode step reallocated"
            attn = torch.cat([attn, attn.new_ones((rows, 1))], dim=-1)
        assert ours.get_seq_length() == theirs.get_seq_length() == held.get_seq_length() == 26
