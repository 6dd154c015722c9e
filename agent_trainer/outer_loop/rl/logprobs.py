"""Per-token log-probs and entropies of the update's samples within memory: the machinery behind ``objective``.

The interface is small: ``collate`` (samples to a padded batch), ``micro_batches`` (cut by rows and tokens),
``token_logprobs`` and ``token_entropies`` (at the loss positions only), ``focus_samples`` (the top tokens by
entropy). Behind it: the transformer body runs once over the rows (their shared prefix once, its keys and values
read by every row: ``_hidden_sharing_prefix``), the LM head over the loss positions only, ``HEAD_CHUNK`` at a time
and recomputed in the backward, so no ``positions x vocab`` tensor of a sequence is ever held. The same loss and
gradients as a plain forward (tests/unit/test_selective_logprobs.py).

    batch = collate(samples, pad_id, share_prefix=True)
    new = token_logprobs(model, batch)     # [rows, seq], 0 off the loss positions
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math

import torch

from agent_trainer.outer_loop.rl.objective import TurnSample


def collate(samples: list[TurnSample], pad_id: int, share_prefix: bool = False) -> dict[str, torch.Tensor]:
    """Right-pad context+completion; the loss mask covers completion tokens only. ``share_prefix``: the batch's
    ``shared_prefix`` is the number of leading tokens every row has alike (``shared_length``), run once."""
    seqs = [s.context_ids + s.completion_ids for s in samples]
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    old = torch.zeros((len(seqs), width), dtype=torch.float32)
    focus = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        start = len(s.context_ids)
        if s.completion_mask is None:
            mask[i, start : len(seq)] = 1.0
        else:
            mask[i, start : len(seq)] = torch.tensor(s.completion_mask, dtype=torch.float32)
        old[i, start : len(seq)] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        focus[i] = mask[i] if s.focus_mask is None else 0.0
        if s.focus_mask is not None:
            focus[i, start : len(seq)] = torch.tensor(s.focus_mask, dtype=torch.float32)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": mask,
        "old_logprobs": old,
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        "temperature": torch.tensor([s.temperature for s in samples], dtype=torch.float32),
        "weights": torch.tensor([s.weight for s in samples], dtype=torch.float32),
        "focus_mask": focus,
        "focus_weights": torch.tensor([s.pg_weight for s in samples], dtype=torch.float32),
        **({"shared_prefix": torch.tensor(shared_length(seqs))} if share_prefix else {}),
    }


MIN_SHARED = 16   # a shared prefix shorter than this is run with the rows (two passes would cost more)


def shared_length(seqs: list[list[int]]) -> int:
    """How many leading tokens all of ``seqs`` (two or more) have alike, leaving each row one of its own; 0 when
    that is under ``MIN_SHARED``."""
    if len(seqs) < 2:
        return 0
    from agent_trainer.outer_loop.agents.prefix_cache import common_length

    n = min(len(x) for x in seqs) - 1
    for other in seqs[1:]:
        n = min(n, common_length(seqs[0], other))
    return n if n >= MIN_SHARED else 0


# Loss positions per LM-head chunk: the head's logits (chunk x vocab) exist for one chunk at a time, in the
# forward and again in the backward (each chunk is recomputed there, not kept).
HEAD_CHUNK = 256


def _backbone_and_head(model):
    """The transformer body (hidden states out) and the LM head of a causal LM, PEFT-wrapped or not; None when
    the model post-processes its logits (soft-capping, a logit scale), where only its own forward is right."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(base, getattr(base, "base_model_prefix", ""), None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    config = getattr(base, "config", None)
    if (backbone is None or head is None or backbone is base or getattr(config, "final_logit_softcapping", None)
            or getattr(config, "logit_scale", None) or getattr(config, "logits_scaling", None)):
        return None
    return backbone, head


def _loss_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Where the update needs a log-prob: the loss mask's positions (all real tokens without one), never 0."""
    want = batch["loss_mask"] > 0 if "loss_mask" in batch else batch["attention_mask"] > 0
    want = want.clone()
    want[:, 0] = False
    return want


def _head_logits(head, hidden: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    return head(hidden).float() / temperature.view(-1, 1)


def _chunk_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    logits = _head_logits(head, hidden, temperature)
    return logits.gather(1, targets.view(-1, 1)).squeeze(1) - torch.logsumexp(logits, dim=-1)


def _chunk_entropies(head, hidden: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(_head_logits(head, hidden, temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _at_positions(model, batch: dict[str, torch.Tensor], per_chunk) -> torch.Tensor:
    """``per_chunk(head, hidden, targets, temperature)`` at the loss positions only, as a ``[batch, seq]`` tensor
    (zeros elsewhere): the body runs over the whole sequences, the LM head over the loss positions, a chunk of
    ``HEAD_CHUNK`` at a time (checkpointed under autograd), so no ``positions x vocab`` tensor of a sequence is
    ever held."""
    from torch.utils.checkpoint import checkpoint

    parts = _backbone_and_head(model)
    ids = batch["input_ids"]
    want = _loss_positions(batch)
    rows, cols = want.nonzero(as_tuple=True)
    temps = batch["temperature"].to(ids.device)[rows]
    if parts is None:   # a model with its own logit post-processing: the full forward, then the positions
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits
        hidden_at = logits[rows, cols - 1]
        head = torch.nn.Identity()
    else:
        backbone, head = parts
        shared = int(batch.get("shared_prefix", 0))
        if shared and _can_share(backbone):
            hidden = _hidden_sharing_prefix(backbone, ids, batch["attention_mask"], shared)
        else:
            hidden = backbone(input_ids=ids, attention_mask=batch["attention_mask"]).last_hidden_state
        hidden_at = hidden[rows, cols - 1]
    targets = ids[rows, cols]
    chunks = []
    for i in range(0, len(rows), HEAD_CHUNK):
        args = (head, hidden_at[i: i + HEAD_CHUNK], targets[i: i + HEAD_CHUNK], temps[i: i + HEAD_CHUNK])
        chunks.append(checkpoint(per_chunk, *args, use_reentrant=False) if torch.is_grad_enabled()
                      else per_chunk(*args))
    values = torch.cat(chunks) if chunks else hidden_at.new_zeros(0, dtype=torch.float32)
    out = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    return out.index_put((rows, cols), values.float())


@functools.cache
def _prefix_layers() -> tuple[type, type]:
    """The cache layers of a shared prefix (transformers is imported lazily): ``Keep`` holds what the prefix's pass
    gives it, ``Read`` gives every row the prefix's keys and values before its own. Neither appends, so a layer
    that gradient checkpointing runs again in the backward pass reads and writes the same as the first time."""
    from transformers.cache_utils import DynamicLayer

    class Keep(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states
            return key_states, value_states

    class Read(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            rows = key_states.shape[0]
            return (torch.cat([self.keys.expand(rows, -1, -1, -1), key_states], dim=-2),
                    torch.cat([self.values.expand(rows, -1, -1, -1), value_states], dim=-2))

    return Keep, Read


def _can_share(backbone) -> bool:
    """Whether this transformers lets a layer keep its cache under gradient checkpointing (it drops it otherwise,
    and the rows would run without their prefix), and the model has no sliding-window layers (whose cache and mask
    the shared prefix's layers do not model): otherwise the rows run whole."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    sliding = any("sliding" in str(t) for t in getattr(backbone.config, "layer_types", None) or ())
    return not sliding and hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache") and "cache" in \
        inspect.signature(type(backbone).forward).parameters


@contextlib.contextmanager
def _layers_keep_cache(backbone):
    """Decoder layers pass their cache through gradient checkpointing (our layers never append: see
    ``_prefix_layers``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in backbone.modules() if isinstance(m, GradientCheckpointingLayer)]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in layers:
            del m._can_checkpoint_with_cache


def _hidden_sharing_prefix(backbone, ids: torch.Tensor, attention: torch.Tensor, shared: int) -> torch.Tensor:
    """The body's hidden states of right-padded rows whose first ``shared`` tokens are the same: those tokens run
    once (their keys and values, with their gradient, read by every row), then each row's own tokens. The same
    numbers as one pass over the whole rows, within float rounding."""
    from transformers.cache_utils import Cache, DynamicCache

    keep, read = _prefix_layers()
    prefix_cache = DynamicCache()
    Cache.__init__(prefix_cache, layer_class_to_replicate=keep)
    with _layers_keep_cache(backbone):
        prefix = backbone(input_ids=ids[:1, :shared], attention_mask=attention[:1, :shared], cache=prefix_cache,
                          use_cache=False).last_hidden_state
        rows_cache = DynamicCache()
        Cache.__init__(rows_cache, layer_class_to_replicate=read)
        for layer in prefix_cache.layers:
            mine = read()
            mine.lazy_initialization(layer.keys, layer.values)
            mine.keys, mine.values = layer.keys, layer.values
            rows_cache.layers.append(mine)
        rest = backbone(input_ids=ids[:, shared:], attention_mask=attention, cache=rows_cache,
                        use_cache=False).last_hidden_state
    return torch.cat([prefix.expand(ids.shape[0], -1, -1), rest], dim=1)


def token_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log pi(token_t | tokens_<t) at each sample's temperature, aligned to input positions (pos 0 = 0), at the
    loss mask's positions (``batch["loss_mask"] > 0``; every position without one); 0 elsewhere."""
    return _at_positions(model, batch, _chunk_logprobs)


@torch.no_grad()
def token_entropies(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Entropy (nats) of pi(. | tokens_<t) at each sample's temperature, aligned like ``token_logprobs``."""
    return _at_positions(model, batch, lambda head, hidden, targets, temperature:
                         _chunk_entropies(head, hidden, temperature))


def micro_batches(samples: list[TurnSample], max_rows: int, max_tokens: int = 0,
                  share_prefix: bool = False) -> list[list[TurnSample]]:
    """``samples`` in order, cut into micro-batches of at most ``max_rows`` rows and, with ``max_tokens`` > 0, at
    most ``max_tokens`` padded tokens (rows x the longest row; with ``share_prefix`` the rows' shared prefix counts
    once: ``shared_length``); a longer row is a micro-batch of its own."""
    out: list[list[TurnSample]] = []
    cur: list[TurnSample] = []
    for s in samples:
        if cur and (len(cur) >= max_rows or (max_tokens > 0 and _padded_tokens(cur + [s], share_prefix) > max_tokens)):
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


def _padded_tokens(rows: list[TurnSample], share_prefix: bool) -> int:
    """The tokens a micro-batch of ``rows`` runs: rows x the longest, the shared prefix once when shared."""
    seqs = [s.context_ids + s.completion_ids for s in rows]
    longest = max(len(x) for x in seqs)
    shared = shared_length(seqs) if share_prefix else 0
    return shared + len(seqs) * (longest - shared)


def focus_samples(model, samples: list[TurnSample], frac: float, pad_id: int, micro_batch_size: int,
                  per_episode_weights: bool, micro_batch_tokens: int = 0,
                  share_prefix: bool = False) -> tuple[list[TurnSample], float]:
    """The samples with ``focus_mask`` set to the top ``frac`` of agent tokens by entropy (ties kept).

    Returns the new samples and the entropy threshold. With ``per_episode_weights`` an episode's
    focused tokens are weighted by 1 / (their number), so each episode's policy-gradient term still
    weighs the same; otherwise every focused token weighs 1."""
    from dataclasses import replace

    per_sample: list[torch.Tensor] = []
    device = next(model.parameters()).device
    for chunk in micro_batches(samples, micro_batch_size, micro_batch_tokens, share_prefix):
        batch = {k: v.to(device) for k, v in collate(chunk, pad_id, share_prefix).items()}
        ent = token_entropies(model, batch).cpu()
        for r, s in enumerate(chunk):
            start = len(s.context_ids)
            per_sample.append(ent[r, start: start + len(s.completion_ids)])
    masks = [torch.ones(len(s.completion_ids)) if s.completion_mask is None
             else torch.tensor(s.completion_mask, dtype=torch.float32) for s in samples]
    pool = torch.cat([e[m > 0] for e, m in zip(per_sample, masks)])
    if pool.numel() == 0:
        return samples, 0.0
    k = max(1, int(math.ceil(frac * pool.numel())))
    threshold = float(torch.topk(pool, k).values.min())
    out = [replace(s, focus_mask=((e >= threshold) & (m > 0)).int().tolist(), focus_weight=1.0)
           for s, e, m in zip(samples, per_sample, masks)]
    if per_episode_weights:
        count: dict[str, int] = {}
        for s in out:
            count[s.episode_id] = count.get(s.episode_id, 0) + s.n_focus
        out = [replace(s, focus_weight=1.0 / count[s.episode_id] if count[s.episode_id] else 0.0) for s in out]
    return out, threshold
