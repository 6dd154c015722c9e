"""The agent's policy: a causal LM with a PEFT LoRA adapter, updated by a group-relative policy gradient.

Each update maximises a clipped, importance-weighted objective over the agent's own sampled tokens only
(advantage: the episode's reward minus its group's mean; an optional k3 KL to the adapter-disabled model;
token or episode aggregation; optionally only the high-entropy tokens). The formula and every setting:
docs/outer_loop.md, "The update, precisely".

    policy = AgentPolicy.from_pretrained(model_dir, OuterConfig(lora_r=16))   # the outer group's settings
    stats = policy.update(samples)          # one outer step over a list of TurnSample
    policy.save(step_dir); policy.load(step_dir)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import lightning as L
from lightning.pytorch.plugins.environments import LightningEnvironment
import torch
from torch.utils.data import DataLoader

from agent_trainer.config import OuterConfig

ADAPTER_DIR = "adapter"
OPTIMIZER_FILE = "optimizer.pt"


# The adapter's dropout and the optimizer's weight decay: none (the update is a few steps of a small LoRA).
LORA_DROPOUT = 0.0
WEIGHT_DECAY = 0.0


@dataclass
class TurnSample:
    """One agent turn: the context it saw, the tokens it sampled, and how they were sampled."""

    context_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]        # sampler log-probs of completion_ids, at ``temperature``
    advantage: float
    temperature: float = 1.0
    policy_version: int = 0
    episode_id: str = ""
    weight: float = 1.0              # per-token weight (1 / episode tokens with loss_aggregation="episode")
    # Which completion tokens are the agent's (1) and which are context in between (0): a merged
    # episode (``merge_turns``) carries tool results between its turns. None = all of them.
    completion_mask: list[int] | None = None
    # ``focus_top_frac`` < 1: which agent tokens the policy-gradient term covers (1) and its per-token
    # weight there; the KL term still covers every agent token. None = all agent tokens, ``weight``.
    focus_mask: list[int] | None = None
    focus_weight: float | None = None

    @property
    def n_targets(self) -> int:
        """Agent tokens the loss covers."""
        return len(self.completion_ids) if self.completion_mask is None else sum(self.completion_mask)

    @property
    def n_focus(self) -> int:
        """Agent tokens the policy-gradient term covers."""
        return self.n_targets if self.focus_mask is None else sum(self.focus_mask)

    @property
    def pg_weight(self) -> float:
        return self.weight if self.focus_weight is None else self.focus_weight


def merge_turns(turns: Sequence[tuple[list[int], list[int], list[float]]]
                ) -> list[tuple[list[int], list[int], list[float], list[int]]]:
    """Fold an episode's turns into as few sequences as possible: ``(context, completion, logprobs, mask)``.

    Turn k+1's prompt is turn k's prompt and completion plus the tool result (the chat template
    re-renders the conversation), so one forward pass over the last turn's sequence scores every
    turn's tokens in the very context they were sampled in: the same objective as one sample per
    turn at a fraction of the update's compute (each turn's context is no longer re-encoded). When a
    re-rendered prompt does not start with the sampled tokens (BPE can re-tokenize a completion
    differently: ~1 turn in 20 here), a new sequence starts there.
    """
    out: list[tuple[list[int], list[int], list[float], list[int]]] = []
    ctx: list[int] = []
    comp: list[int] = []
    lps: list[float] = []
    mask: list[int] = []
    for prompt, tokens, logprobs in turns:
        seq = ctx + comp
        if comp and len(prompt) >= len(seq) and prompt[: len(seq)] == seq:
            gap = list(prompt[len(seq):])
            comp += gap + list(tokens)
            lps += [0.0] * len(gap) + list(logprobs)
            mask += [0] * len(gap) + [1] * len(tokens)
            continue
        if comp:
            out.append((ctx, comp, lps, mask))
        ctx, comp, lps, mask = list(prompt), list(tokens), list(logprobs), [1] * len(tokens)
    if comp:
        out.append((ctx, comp, lps, mask))
    return out


def group_advantages(rewards: Sequence[float], scale_by_std: bool = False) -> list[float]:
    """A_i = r_i - mean(r), optionally divided by the group's std (plus 1e-6)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    adv = [r - mean for r in rewards]
    if scale_by_std:
        std = math.sqrt(sum(a * a for a in adv) / len(adv))
        adv = [a / (std + 1e-6) for a in adv]
    return adv


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


def _quiet_lightning() -> None:
    """Lightning announces devices and tips on every Trainer; one per outer step is noise."""
    import logging
    import warnings

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
    # Lightning's resume check asks SLURM's detection even with the environment pinned (plugins= below): the
    # hint to launch with srun is wrong for one process on a login node or inside a SLURM job.
    warnings.filterwarnings("ignore", message=".*The `srun` command is available.*")
    # Deprecation notices from inside lightning/transformers (not our calls), once per outer step otherwise.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")


class PolicyModule(L.LightningModule):
    """Lightning module for the clipped, group-relative policy-gradient step (docs/outer_loop.md: "The update")."""

    def __init__(self, model, config: OuterConfig):
        super().__init__()
        self.model = model
        self.config = config
        self._optimizer: torch.optim.Optimizer | None = None
        self.last_stats: dict[str, float] = {}
        self._acc: dict[str, list[float]] = {}
        self.norm: float | None = None   # sum of token weights of the whole step (set by AgentPolicy.update)
        self.pg_norm: float | None = None  # the same over the policy-gradient (focused) tokens
        self.accumulate = 1              # micro-batches per optimizer step

    def configure_optimizers(self):
        # One optimizer for the whole training: a fresh Trainer per outer step reuses it, so Adam's
        # moments carry over from step to step (and are checkpointed with the adapter).
        if self._optimizer is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self._optimizer = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=WEIGHT_DECAY)
        return self._optimizer

    def on_before_optimizer_step(self, optimizer):
        """Linear lr warm-up over the first ``lr_warmup_steps`` optimizer steps. Adam's first step moves
        every adapter weight by the full lr whatever its gradient (m / sqrt(v) is the gradient's sign),
        which at the outer lr dropped a few tokens' log-probs by ~10 nats. The count is Adam's own step
        counter, which is checkpointed with the optimizer, so a resumed run continues the schedule."""
        warm = self.config.lr_warmup_steps
        if warm <= 0:
            return
        done = max((int(st["step"]) for st in optimizer.state.values() if "step" in st), default=0)
        for group in optimizer.param_groups:
            group["lr"] = self.config.lr * min(1.0, (done + 1) / warm)

    def training_step(self, batch, batch_idx):
        cfg = self.config
        new = token_logprobs(self.model, batch)
        mask = batch["loss_mask"]
        adv = batch["advantages"].view(-1, 1)
        ratio = torch.exp((new - batch["old_logprobs"]) * mask)
        high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
        surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + high) * adv)
        kl = torch.zeros_like(new)
        if cfg.kl_beta > 0:
            with torch.no_grad(), self.model.disable_adapter():
                ref = token_logprobs(self.model, batch)
            delta = ref - new
            kl = torch.exp(delta) - delta - 1
        n_tokens = mask.sum().clamp(min=1.0)
        weighted = mask * batch["weights"].view(-1, 1)    # all ones with token aggregation
        pg_weighted = batch["focus_mask"] * batch["focus_weights"].view(-1, 1)   # = weighted without focus
        # Normalised over the whole step's batch (not this micro-batch), and the gradients of every
        # micro-batch are accumulated into one optimizer step per epoch: each update sees whole
        # groups, so a micro-batch holding one bad episode cannot move the policy on its own.
        # Lightning divides a returned loss by accumulate_grad_batches; ``accumulate`` undoes that.
        norm = self.norm if self.norm is not None else weighted.sum().clamp(min=1e-12)
        pg_norm = self.pg_norm if self.pg_norm is not None else pg_weighted.sum().clamp(min=1e-12)
        loss = ((-surrogate * pg_weighted).sum() / pg_norm
                + cfg.kl_beta * (kl * weighted).sum() / norm) * self.accumulate
        with torch.no_grad():
            clipped = ((ratio - 1).abs() > cfg.clip_eps).float()
            for k, v in {
                "loss": loss.item() / self.accumulate,
                "ratio_mean": ((ratio * mask).sum() / n_tokens).item(),
                "clip_frac": ((clipped * mask).sum() / n_tokens).item(),
                "kl": ((kl * mask).sum() / n_tokens).item(),
                "tokens": n_tokens.item(),
            }.items():
                self._acc.setdefault(k, []).append(v)
        return loss

    def on_train_epoch_end(self):
        # loss: the step's objective (its micro-batch parts add up); tokens: a count; the rest: means.
        epochs = self.current_epoch + 1
        self.last_stats = {k: (sum(v) / epochs if k in ("tokens", "loss") else sum(v) / len(v))
                           for k, v in self._acc.items()}


def device_kwargs(device: str) -> dict:
    """Lightning ``Trainer`` kwargs of the policy's update on ``device`` (``cpu`` or ``cuda``): one GPU in bf16
    mixed precision where it has bf16 (fp32 weights and optimizer state, as the CPU's)."""
    if device == "cpu":
        return {"accelerator": "cpu", "devices": 1}
    return {"accelerator": "gpu", "devices": 1,
            "precision": "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"}


def return_large_frees_to_os(threshold: int = 1 << 20) -> bool:
    """Have glibc serve allocations of ``threshold`` bytes and more by mmap, so that freeing one gives its pages
    back at once, and give back now what its heaps hold free. By default glibc raises that threshold after large
    frees and then keeps freed activations in its heap: on SmolLM2 (1,500-token sequence, LoRA, checkpointing) the
    update's peak RSS was 2.7 GB with the default and 1.1 GB with this, the same tensors in both. The setting only
    governs later allocations: what the heap already held free (a warm start trained in the same process, earlier
    work) stays resident until ``malloc_trim(0)`` hands it back. False where the C library has no ``mallopt``
    (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(-3, int(threshold)))   # -3: M_MMAP_THRESHOLD
        libc.malloc_trim(0)
        return ok
    except (OSError, AttributeError):
        return False


class AgentPolicy:
    """The agent model with its LoRA adapter, the Lightning update, and checkpointing.

    ``trainer_kwargs`` go to Lightning's ``Trainer`` (``device_kwargs``); with a GPU accelerator the model
    lives on the GPU between updates too, where the local backend samples from it."""

    def __init__(self, model, tokenizer, config: OuterConfig, trainer_kwargs: dict | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.module = PolicyModule(model, config)
        self.trainer_kwargs = dict(trainer_kwargs or {})
        self.device = torch.device("cuda" if self.trainer_kwargs.get("accelerator") in ("gpu", "cuda") else "cpu")
        self.model.to(self.device)
        return_large_frees_to_os()
        if config.gradient_checkpointing:
            # Non-reentrant: frees each layer's activations even though the frozen inputs need no gradient
            # (the reentrant kind needs enable_input_require_grads and keeps them under PEFT).
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            if hasattr(base, "activation_checkpointing_enable"):   # transformers >= 5.2x
                base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            base.config.use_cache = False
        self.version = 0  # number of updates applied

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: OuterConfig, adapter_dir: str | Path | None = None,
                        trainer_kwargs: dict | None = None, seed: int = 0) -> "AgentPolicy":
        """Load the base agent from ``model_dir`` and add a fresh (or saved) LoRA adapter.

        A fresh adapter's random half (LoRA A) is drawn from ``seed``, without touching the global RNG:
        two runs of one seed start from the same policy (PEFT draws from torch's global RNG, which
        nothing had seeded: runs of the same seed differed from their first update)."""
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        _quiet_lightning()   # PEFT's wrapping calls a deprecated transformers property (a FutureWarning otherwise)

        tok = AutoTokenizer.from_pretrained(model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if adapter_dir is not None:
            model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
        else:
            lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=LORA_DROPOUT,
                              target_modules=config.lora_target_modules, task_type="CAUSAL_LM")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = get_peft_model(base, lora)
        return cls(model, tok, config, trainer_kwargs)

    def update(self, samples: list[TurnSample]) -> dict[str, float]:
        """One outer step: ``config.epochs`` passes of the clipped objective over ``samples``."""
        samples = [s for s in samples if s.completion_ids]
        if not samples:
            return {"skipped": 1.0}
        if self.config.kl_beta == 0 and all(s.advantage == 0 for s in samples):
            # Equal rewards and no KL term: the gradient is zero. An optimizer step would still move the adapter
            # by Adam's momentum (and weight decay) with no signal; the adapter and the optimizer stay as they are.
            return {"skipped": 1.0, "samples": float(len(samples))}
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        focus: dict[str, float] = {}
        if self.config.focus_top_frac < 1:
            self.model.eval()
            before = sum(s.n_targets for s in samples)
            reference = self.config.focus_entropy_of == "reference" and hasattr(self.model, "disable_adapter")
            with self.model.disable_adapter() if reference else contextlib.nullcontext():
                samples, threshold = focus_samples(self.model, samples, self.config.focus_top_frac, pad,
                                                   self.config.micro_batch_size,
                                                   per_episode_weights=self.config.loss_aggregation == "episode",
                                                   micro_batch_tokens=self.config.micro_batch_tokens,
                                                   share_prefix=self.config.share_prefix)
            focus = {"focus_entropy_threshold": threshold,
                     "focus_kept": sum(s.n_focus for s in samples) / max(1, before)}
        share = self.config.share_prefix
        batches = micro_batches(samples, self.config.micro_batch_size, self.config.micro_batch_tokens, share)
        loader = DataLoader(batches, batch_size=None, shuffle=False, collate_fn=lambda b: collate(b, pad, share))
        n_batches = len(batches)
        self.module.norm = max(1e-12, sum(s.weight * s.n_targets for s in samples))
        self.module.pg_norm = max(1e-12, sum(s.pg_weight * s.n_focus for s in samples))
        self.module.accumulate = n_batches
        kwargs = dict(accelerator="cpu", devices=1, max_epochs=self.config.epochs, logger=False,
                      accumulate_grad_batches=n_batches,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      gradient_clip_val=self.config.max_grad_norm, num_sanity_val_steps=0,
                      # One process, whatever the environment: inside a SLURM job (a sweep's run) Lightning would
                      # read SLURM_* as a multi-process launch, and with srun on the PATH it warns at every update.
                      plugins=[LightningEnvironment()])
        kwargs.update(self.trainer_kwargs)
        _quiet_lightning()
        self.model.train()
        self.module._acc = {}
        L.Trainer(**kwargs).fit(self.module, train_dataloaders=loader)
        self.model.to(self.device).eval()   # Lightning's teardown leaves the model on the CPU
        return_large_frees_to_os()   # the heap's freed fragments back before the next sampling
        self.version += 1
        return dict(self.module.last_stats, samples=float(len(samples)), **focus)

    @torch.no_grad()
    def merged_weights(self):
        """(name, tensor) of the base model's weights with the LoRA folded in, under the base model's own
        (transformers) names: what a vLLM engine of the same base loads (``VLLMBackend.load_weights``).

        Computed as W + delta (PEFT's ``get_delta_weight``), not by merging in place and back, which would
        leave rounding in the frozen weights after every update."""
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        deltas = {f"{name}.weight": sum(m.get_delta_weight(a) for a in m.active_adapters if a in m.lora_A)
                  for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        for name, param in base.named_parameters():
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            yield name, (param + deltas[name]) if name in deltas else param

    # --- checkpoints ---------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Write the adapter, the optimizer state and the version into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(d / ADAPTER_DIR))
        state = {"version": self.version, "config": asdict(self.config)}
        if self.module._optimizer is not None:
            state["optimizer"] = self.module._optimizer.state_dict()
        torch.save(state, d / OPTIMIZER_FILE)

    def load_state(self, directory: str | Path) -> None:
        """Restore the optimizer state and version saved by ``save`` (the adapter is loaded by from_pretrained)."""
        state = torch.load(Path(directory) / OPTIMIZER_FILE, weights_only=False)
        self.version = int(state["version"])
        if "optimizer" in state:
            self.module.configure_optimizers().load_state_dict(state["optimizer"])

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Copies of the trainable (LoRA) tensors, for tests and diagnostics."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def frozen_state(self) -> dict[str, torch.Tensor]:
        """Copies of the frozen (base) tensors."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if not p.requires_grad}
