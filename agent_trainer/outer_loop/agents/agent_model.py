"""The tiny agent: a Qwen3-architecture LM warm-started on transcripts of the scripted novice.

``build_agent_model`` (registered with ``agent_trainer.inner_loop.models`` as ``tiny-agent``, so ``at-models`` and
``resolve_model("tiny-agent")`` build it) does three things, deterministically from the seed:

1. plays ``n_transcripts`` novice episodes (``agent_trainer.outer_loop.agents.novice``) on the training families through
   the real workspace and tools (jobs are submitted, never run: the episode ends at submission);
2. renders each as the chat template renders a conversation for the agent backend (compact tool
   schemas, the same system and task messages as ``agent_trainer.outer_loop.episode.episode``);
3. trains the model on the assistant tokens only (context masked), then saves it with
   ``save_pretrained`` plus the project tokenizer and a manifest of hashes.

So the agent writes real jobs from its first step, with the novice's broad, imperfect prior.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

AGENT_MODEL = "tiny-agent"
# The agent's cache folder version (``tiny-agent-seed0-v<N>``): bump it whenever the transcripts or the
# warm start change.
AGENT_BUILD_VERSION = 5
# The tiny agent sees tools as one line of signatures (agent_trainer.outer_loop.episode.episode, tool_schemas: names):
# full JSON schemas would be ~1,900 of its ~2,500 context tokens per turn.
TOOL_STYLE = "names"


@dataclass(frozen=True)
class AgentBuildConfig:
    """Size and warm-start schedule of the tiny agent (~167 K parameters).

    Measured on the 2-core CPU (one thread; a second thread made each step ~8x slower while another
    process held a core): ~0.22 s per step of 4 transcripts (~900 tokens each), ~3 minutes per build.
    Many small steps beat fewer large ones here: at equal tokens, batch 4 x 720 steps wrote well-formed
    calls in 100% of turns and copied the task's family far more often than batch 8 x 360.
    """

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 192
    max_positions: int = 4096
    n_transcripts: int = 240
    steps: int = 720
    batch_size: int = 4
    lr: float = 5e-3
    warmup: int = 20
    min_lr_ratio: float = 0.05
    threads: int = 1


DEFAULT_AGENT = AgentBuildConfig()


def transcript_families() -> list[str]:
    """Families the warm start plays: the training ones (held-out families are never seen)."""
    from agent_trainer.evaluation.families import family_names

    return family_names(include_held_out=False)


def training_tasks() -> list:
    """The task specs of the training families, ``examples/tasks/<family>_v1_{fast,tiny}.json`` (both
    budgets, so the novice's step counts follow the budget in the task message), interleaved by family."""
    from agent_trainer.paths import PROJECT_ROOT
    from agent_trainer.evaluation.tasks import load_task

    folder = PROJECT_ROOT / "examples" / "tasks"
    return [load_task(folder / f"{f}_v1_{v}.json") for v in ("fast", "tiny") for f in transcript_families()
            if (folder / f"{f}_v1_{v}.json").is_file()]


def play_novice(task, rng: random.Random, work: Path, tool_style: str = TOOL_STYLE) -> list[dict[str, Any]]:
    """One novice episode through the real tools; returns the conversation (OpenAI message format), opened
    as an episode with ``tool_style`` (``agent.tool_schemas``) opens it."""
    from agent_trainer.outer_loop.episode.episode import opening_messages
    from agent_trainer.outer_loop.agents.novice import novice_episode
    from agent_trainer.outer_loop.episode.tools import ToolBox, ToolLimits
    from agent_trainer.outer_loop.episode.workspace import Workspace

    ws = Workspace.create(work / "workspace", task)
    box = ToolBox(ws, task, limits=ToolLimits(max_turns=12, max_jobs_per_episode=1), jobs_dir=work / "jobs",
                  defer_jobs=True, validate_kwargs={"dry_run": False}, compute_missing_baselines=True)
    messages = opening_messages(task, tool_style)
    script = novice_episode(task, rng)
    result = None
    for i in range(64):
        try:
            call = script.send(result) if i else next(script)
        except StopIteration:
            break
        cid = f"call_{i}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": call["name"],
                                                         "arguments": json.dumps(call["arguments"])}}]})
        result = box.call(call["name"], call["arguments"])
        if call["name"] == "submit_job":
            break  # the episode ends at submission; what follows is the harness's business
        messages.append({"role": "tool", "tool_call_id": cid, "name": call["name"], "content": result.text})
    return messages


def encode_transcript(messages: list[dict[str, Any]], tokenizer, tools: list[dict] | None,
                      support=None, tool_format: str | None = None,
                      context_only: frozenset[int] | set[int] = frozenset()) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a 0/1 mask marking the assistant's own tokens (those of the
    assistant messages at the indices in ``context_only`` are marked 0: context, not a target).

    Each assistant turn is the difference between the rendering up to and including it and the
    rendering of what came before plus the generation prompt: exactly what the agent backend
    samples after that prompt (ending with the end-of-turn token). ``support`` (a template's
    ``agent_trainer.outer_loop.agents.chat_prompt.TemplateSupport``): the conversation is adapted as the local
    backend adapts it for a template that drops tools (calls written in ``tool_format``).
    """
    def render(msgs, gen):
        if support is not None:
            from agent_trainer.outer_loop.agents.chat_prompt import adapt_messages
            from agent_trainer.outer_loop.agents.toolcalls import resolve_format

            msgs, used = adapt_messages(msgs, tools, support, resolve_format(tool_format, tokenizer.chat_template))
        else:
            used = tools
        text = tokenizer.apply_chat_template(msgs, tools=used, add_generation_prompt=gen, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids: list[int] = []
    mask: list[int] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render(messages[:i], True)
        full = render(messages[: i + 1], False)
        if full[: len(prompt)] != prompt:
            raise ValueError("chat template is not prefix-consistent; the agent could not be trained on it")
        if ids and prompt[: len(ids)] != ids:
            raise ValueError("chat template re-renders earlier turns differently")
        context = prompt[len(ids):]
        target = full[len(prompt):]
        # The end-of-turn token closes the sampled text; anything after it (a newline) is context.
        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        cut = target.index(eot) + 1 if eot in target else len(target)
        ids += context + target[:cut]
        mask += [0] * len(context) + [0 if i in context_only else 1] * cut
        ids += target[cut:]
        mask += [0] * (len(target) - cut)
    return ids, mask


def _agent_config(cfg: AgentBuildConfig, tokenizer):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads, max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id, use_cache=True,
    )


def build_agent_model(out_dir: str | Path, seed: int = 0, on_step: Callable[[int], None] | None = None,
                      cfg: AgentBuildConfig = DEFAULT_AGENT) -> dict:
    """Build the tiny agent into ``out_dir`` (see the module docstring); returns the manifest."""
    from transformers import Qwen3ForCausalLM

    from agent_trainer.inner_loop.models import build_tokenizer
    from agent_trainer.inner_loop.models.build import write_manifest
    from agent_trainer.outer_loop.episode.episode import tool_schemas_for
    from agent_trainer.outer_loop.episode.tools import SCHEMAS

    out = Path(out_dir)
    t0 = time.time()
    tokenizer = build_tokenizer()
    tools = tool_schemas_for(SCHEMAS, TOOL_STYLE)
    tasks = training_tasks()
    rng = random.Random(f"tiny-agent/{seed}")
    sequences = []
    work = Path(tempfile.mkdtemp(prefix="agent-transcripts-"))
    try:
        for i in range(cfg.n_transcripts):
            messages = play_novice(tasks[i % len(tasks)], rng, work / f"{i:04d}")
            sequences.append(encode_transcript(messages, tokenizer, tools))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    t_transcripts = time.time() - t0

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_agent_config(cfg, tokenizer))
    loss = _warm_start(model, sequences, cfg, seed, tokenizer.pad_token_id, on_step)
    torch.set_num_threads(prev_threads)

    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    lengths = [len(s[0]) for s in sequences]
    info = {"name": AGENT_MODEL, "seed": seed, "build": asdict(cfg), "build_version": AGENT_BUILD_VERSION,
            "final_loss": loss,
            "transcripts": len(sequences), "mean_tokens": sum(lengths) / len(lengths), "max_tokens": max(lengths),
            "seconds": {"transcripts": round(t_transcripts, 1), "total": round(time.time() - t0, 1)}}
    return write_manifest(out, info)


def _batches(lengths: list[int], batch_size: int, gen: torch.Generator) -> list[list[int]]:
    """One epoch of length buckets: sequences sorted by length, cut into batches of neighbours (little
    padding), the batches in a random order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


def _warm_start(model, sequences, cfg: AgentBuildConfig, seed: int, pad_id: int, on_step) -> float:
    """Supervised training on the assistant tokens: length-bucketed batches, warmup then cosine decay.

    Right padding needs no attention mask under causal attention (no real token sees a later pad),
    so the fast causal kernel runs; the output layer runs on the assistant positions only.
    Returns the mean loss over the last tenth of the steps.
    """
    import math

    gen = torch.Generator().manual_seed(seed)
    data = [(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)) for ids, mask in sequences]
    lengths = [len(ids) for ids, _ in sequences]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    queue: list[list[int]] = []
    tail: list[float] = []
    for step in range(cfg.steps):
        warm = min(1.0, (step + 1) / cfg.warmup)
        decay = 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for g in opt.param_groups:
            g["lr"] = cfg.lr * warm * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay)
        if not queue:
            queue = _batches(lengths, cfg.batch_size, gen)
        batch = [data[i] for i in queue.pop()]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        target = torch.zeros((len(batch), width), dtype=torch.bool)
        for r, (seq, mask) in enumerate(batch):
            ids[r, : len(seq)] = seq
            target[r, : len(seq)] = mask
        hidden = model.model(input_ids=ids).last_hidden_state
        # position t predicts token t+1: keep the positions whose next token is the assistant's
        pick = target[:, 1:]
        logits = model.lm_head(hidden[:, :-1][pick])
        loss = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][pick])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= cfg.steps - max(1, cfg.steps // 10):
            tail.append(float(loss.detach()))
        if step % 50 == 0 or step == cfg.steps - 1:
            log.debug("tiny-agent warm start: step %d/%d, loss %.4f, lr %.2e", step, cfg.steps, float(loss.detach()),
                      opt.param_groups[0]["lr"])
        if on_step:
            on_step(step)
    model.eval()
    return sum(tail) / len(tail)


def register() -> None:
    """Make ``tiny-agent`` a model that ``build_all`` and ``resolve_model`` know."""
    from agent_trainer.inner_loop.models import register_builder

    register_builder(AGENT_MODEL, lambda out_dir, seed, on_step=None: build_agent_model(out_dir, seed, on_step),
                     DEFAULT_AGENT.steps, version=AGENT_BUILD_VERSION)
