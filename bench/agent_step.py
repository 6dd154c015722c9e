"""What a real agent's outer step costs, side by side: SmolLM2 (the recipe's warm start) as the agent.

1. Sampling 8 episodes (2 tasks x 4, the ``experiment=smollm2_cpu`` settings): one episode after the other
   (``Episode.play``, one sequence at a time, each prompt run whole: as before) vs together (``play_together``:
   every live episode's next turn in one padded batch, each starting from its stored prefix: the earlier turns'
   keys and values, the system prompt the episodes share). The same seeds give the same episodes both ways
   (counted).
2. The update of those 8 episodes: before (the LM head and a full-vocabulary log-softmax at every position,
   ``outer.micro_batch_size`` rows a micro-batch, no checkpointing, glibc's default heap) vs after (the recipe:
   log-probs at the loss positions only, token-capped micro-batches, gradient checkpointing, large frees
   returned to the OS). Each side in a process of its own: its peak RSS, seconds and loss (the same both sides),
   and its memory phase by phase (model load; forward, backward of each micro-batch; the optimizer step: each
   phase's peak and what holds memory at its end, ``bench/_memory.py``). A side's peak is its own process's
   high-water mark (``VmHWM``), never ``ru_maxrss``: a child's ``ru_maxrss`` starts at its parent's peak (Linux
   carries it over ``exec``): on a fresh clone, where the sampling side also built the warm start, every side read
   >= 5.5 GB that way.
3. One outer step of ``at-train experiment=smollm2_cpu`` end to end: its episodes, jobs and update, without the
   fixed-seed evaluations a run plays before its first update and after its last (held-out, the training tasks):
   its sampling, jobs and update seconds, and the at-train process's own peak RSS (sampling and update in one
   process).

    .venv/bin/python bench/agent_step.py                  # all three (~30 min on 2 cores)
    .venv/bin/python bench/agent_step.py --parts update   # 2 only, on 8 episodes sampled together (~10 min)
    .venv/bin/python bench/agent_step.py --parts sampling # 1 only (~8 min)
    .venv/bin/python bench/agent_step.py --parts step     # 3 only (~7 min)
    .venv/bin/python bench/agent_step.py --parts update --episodes <work folder>/episodes.json \
        --update-sides after_unshared,after              # 2 on earlier episodes: the shared opening once, or each row
    .venv/bin/python bench/agent_step.py --parts update --synthetic --update-sides after,before_1row \
        -- agent.model=smollm2-135m                      # 2 on rows of the episodes' shape: no warm start, no sampling
    .venv/bin/python bench/agent_step.py --max-turns 2    # shorter episodes (a quicker look)

Prints ``RATIO agent_sampling_batched`` (target >= 3), ``RATIO agent_update_memory`` (target >= 2, against one row a
micro-batch), ``RATIO agent_update_after_gb`` (target <= 4) and the step's seconds (target <= 360).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import _memory as M  # noqa: E402

RECIPE = "experiment=smollm2_cpu"
TASKS = ("examples/tasks/calc_chain_v1_tiny.json", "examples/tasks/sort_numbers_v1_tiny.json")


def recipe_config(overrides: list[str]):
    from agent_trainer.config import compose_config, validate

    return validate(compose_config([RECIPE, "tracking=off", *overrides], "train"))


def make_episodes(backend, conf, folder: Path, tag: str, group: int) -> list:
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.outer_loop.episode.episode import Episode
    from agent_trainer.outer_loop.rl.run_config import episode_settings, job_settings

    settings, jobs = episode_settings(conf), job_settings(conf)
    out = []
    for t_i, spec in enumerate(TASKS):
        task = load_task(C.ROOT / spec)
        for g in range(group):
            out.append(Episode(backend, task, folder / tag / f"{task.name}-{g}", settings=settings, seed=1000 * t_i + g,
                               defer_jobs=True, job_settings=jobs, model_name="smollm2-agent"))
    return out


def sampling_side(conf, folder: Path, group: int, one_by_one: bool = True) -> tuple[dict, list[dict]]:
    """Seconds of one-by-one (unless ``one_by_one`` is False) and batched sampling of the same episodes; the batched
    side's turns."""
    import torch

    from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent
    from agent_trainer.outer_loop.agents.local import LocalBackend
    from agent_trainer.outer_loop.episode.episode import play_together
    from agent_trainer.outer_loop.rl.policy import AgentPolicy
    from agent_trainer.outer_loop.rl.run_config import agent_threads

    torch.set_num_threads(agent_threads(conf))
    agent_dir = resolve_agent(conf.agent.model, progress=False)
    policy = AgentPolicy.from_pretrained(agent_dir, conf.outer, seed=0)
    def backend(prefix_cache_tokens: int) -> LocalBackend:
        return LocalBackend(policy.model, policy.tokenizer, device="cpu", model_name="smollm2-agent",
                            tool_format=conf.agent.tool_format, prefix_cache_tokens=prefix_cache_tokens)

    out: dict = {"threads": torch.get_num_threads()}
    alone = make_episodes(backend(0), conf, folder, "alone", group) if one_by_one else []   # each prompt run whole
    with C.clock(out, "one_by_one_s"):
        for ep in alone:
            ep.play()
    batched = backend(32768)
    together = make_episodes(batched, conf, folder, "together", group)
    with C.clock(out, "together_s"):
        play_together(together)
    out["prefix_tokens_kept_at_end"] = batched.prefixes.tokens() if batched.prefixes is not None else 0
    if alone:
        out["same_episodes"] = sum(a.messages == b.messages for a, b in zip(alone, together))
    else:
        del out["one_by_one_s"]
    out["episodes"] = len(together)
    out["turns"] = sum(len(ep.turns) for ep in together)
    out["tokens_out"] = sum(ep.tokens_out for ep in together)
    out["tokens_in"] = sum(ep.tokens_in for ep in together)
    rows = [{"episode_id": ep.id, "turns": [[t.prompt_ids, t.completion_ids, t.logprobs] for t in ep.turns],
             "temperature": ep.settings.agent.temperature} for ep in together]
    for ep in alone + together:
        ep.finish()
    return out, rows


# The shape of the bench's 8 sampled episodes (2026-12-04/05 runs: 31 turns, 2,408 tokens sampled, 11,167 tokens in
# the update's rows): 866 opening tokens every episode shares, 1,020 the episodes of a task share, ~4 turns an
# episode of ~75 sampled tokens each, short tool results between them; one row an episode (the turns merge).
SYNTHETIC_LENGTHS = ((1460, 1420, 1380, 1350), (1450, 1410, 1370, 1327))
SYNTHETIC_OPENING, SYNTHETIC_TASK_OPENING, SYNTHETIC_TURNS, SYNTHETIC_TURN_TOKENS = 866, 1020, 4, 75


def synthetic_rows(vocab: int, seed: int = 0) -> list[dict]:
    """Episodes of the shape above with random token ids (``episodes.json``'s format): an update's memory and
    time depend on the rows' lengths and what they share, not on which tokens they hold; no warm start or sampling
    needed."""
    import random

    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(3, vocab) for _ in range(n)]   # noqa: E731
    common = ids(SYNTHETIC_OPENING)
    rows = []
    for t, lengths in enumerate(SYNTHETIC_LENGTHS):
        opening = common + ids(SYNTHETIC_TASK_OPENING - SYNTHETIC_OPENING)
        for g, length in enumerate(lengths):
            gaps = length - SYNTHETIC_TASK_OPENING - SYNTHETIC_TURNS * SYNTHETIC_TURN_TOKENS
            prompt, turns = list(opening), []
            for k in range(SYNTHETIC_TURNS):
                comp = ids(SYNTHETIC_TURN_TOKENS)
                turns.append([list(prompt), comp, [-1.0] * len(comp)])
                prompt += comp + ids(gaps // (SYNTHETIC_TURNS - 1) + (k < gaps % (SYNTHETIC_TURNS - 1)))
            rows.append({"episode_id": f"synthetic-{t}-{g}", "turns": turns, "temperature": 0.7})
    return rows


def samples_of(rows: list[dict]):
    """Turn samples of the episodes with alternating advantages (what an update of a step sees)."""
    from agent_trainer.outer_loop.rl.objective import TurnSample, merge_turns

    out = []
    for i, r in enumerate(rows):
        n = sum(len(t[1]) for t in r["turns"])
        for ctx, comp, lps, mask in merge_turns([tuple(t) for t in r["turns"]]):
            out.append(TurnSample(ctx, comp, lps, 1.0 - 0.3 * i, r["temperature"], 0, r["episode_id"],
                                  1.0 / max(1, n), completion_mask=mask))
    return out


def update_child(side: str, rows_file: str, overrides: list[str]) -> None:
    """One side of the update comparison, in this (fresh) process; prints a JSON line."""
    import torch

    import agent_trainer.outer_loop.rl.policy as P
    from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent
    from agent_trainer.outer_loop.rl.run_config import agent_threads

    conf = recipe_config(overrides)
    torch.set_num_threads(agent_threads(conf))
    cfg = conf.outer
    if side == "before":
        from dataclasses import replace

        cfg = replace(cfg, micro_batch_tokens=0, gradient_checkpointing=False, share_prefix=False)

        def full_vocabulary(model, batch):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
            logits = logits.float() / batch["temperature"].view(-1, 1, 1)
            logp = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
            return torch.nn.functional.pad(logp, (1, 0))

        P.token_logprobs = full_vocabulary
        P.return_large_frees_to_os = lambda *a: False   # glibc's default heap, as before
    phases: list[dict] = []
    with M.phase("model load", phases):
        policy = P.AgentPolicy.from_pretrained(resolve_agent(conf.agent.model, progress=False), cfg, seed=0)
        samples = samples_of(json.loads(Path(rows_file).read_text()))
    probe = M.make_phase_callback(policy.model, policy.module.configure_optimizers)
    policy.trainer_kwargs["callbacks"] = [probe]
    t0 = time.perf_counter()
    with M.RssSampler() as whole:
        stats = policy.update(samples)
    seconds = time.perf_counter() - t0
    phases += probe.rows
    # What glibc held free at the end and gives back on request: the allocator's share of the last RSS.
    with M.phase("malloc_trim(0) after the update", phases):
        trimmed = M.trim()
    phases[-1]["trimmed_gb"] = trimmed
    print(json.dumps({"side": side, "seconds": round(seconds, 2), "loss": stats.get("loss"),
                      "kl": stats.get("kl"), "rows": len(samples), "model_loaded_gb": round(phases[0]["peak_gb"], 3),
                      "peak_rss_gb": round(max(whole.max_gb, *(r["peak_gb"] for r in phases)), 3), "phases": phases,
                      "tokens": sum(len(s.context_ids) + len(s.completion_ids) for s in samples)}))


# The update's sides: before with the recipe's micro-batch rows, before with one row a micro-batch (the least
# memory the old update can take), after (the recipe: the rows' shared opening run once, 4,096 tokens a
# micro-batch), after without the shared opening (2,048 tokens a micro-batch, one episode each: the recipe before
# it), and after with the shared opening at 2,048 tokens.
UPDATE_SIDES = {"before": [], "before_1row": ["outer.micro_batch_size=1"], "after": [],
                "after_unshared": ["outer.share_prefix=false", "outer.micro_batch_tokens=2048"],
                "after_shared_2k": ["outer.share_prefix=true", "outer.micro_batch_tokens=2048"]}


def update_side(rows_file: Path, overrides: list[str], sides: list[str]) -> dict:
    """Each of ``sides`` (``UPDATE_SIDES``) in a process of its own; a side the kernel kills for memory is reported
    as such."""
    out = {}
    for side, extra in ((k, UPDATE_SIDES[k]) for k in sides):
        proc = subprocess.run([sys.executable, __file__, "--update-child", side.split("_")[0], str(rows_file), "--",
                               *overrides, *extra], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == -9:
            out[side] = {"error": "killed by SIGKILL (out of memory: the machine's RAM was not enough)"}
        elif proc.returncode != 0 or not lines:
            out[side] = {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
        else:
            out[side] = json.loads(lines[-1])
    return out


STEP_SECONDS = ("seconds_sampling", "seconds_jobs", "seconds_update", "seconds_step")
# One step without the fixed-seed evaluations (held-out, and the training tasks' 8 x 5 episodes): a run plays them
# before its first update and after its last, not in every step, and at-train counts them in that step's seconds.
STEP_OVERRIDES = ("outer.steps=1", "outer.heldout_at_start=false", "outer.heldout_episodes=0",
                  "outer.train_eval_episodes=0", "tracking=off")


def step_side(folder: Path, overrides: list[str]) -> dict:
    """One outer step of the recipe through at-train, without the fixed-seed evaluations, its seconds from
    metrics.jsonl: the step, and its sampling, jobs (waited beyond the sampling) and update; and the at-train
    process's own peak RSS (its ``VmHWM``, read while it runs: sampling and update in one process)."""
    run_id = f"bench-agent-step-{int(time.time())}"
    cmd = [str(Path(sys.executable).parent / "at-train"), RECIPE, *STEP_OVERRIDES, f"runs_dir={folder / 'runs'}",
           f"run_id={run_id}", *overrides]
    t0 = time.perf_counter()
    log = folder / f"{run_id}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        peak = M.watch_peak_gb(proc)
    wall = time.perf_counter() - t0
    metrics = folder / "runs" / run_id / "metrics.jsonl"
    if proc.returncode != 0 or not metrics.exists():
        tail = log.read_text().strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {tail}", "wall_s": round(wall, 1)}
    row = json.loads(metrics.read_text().splitlines()[0])
    keep = (*STEP_SECONDS, "seconds_jobs_busy", "reward_mean", "valid_first_try", "update_tokens", "tokens")
    return {"wall_s": round(wall, 1), "at_train_peak_rss_gb": round(peak, 3), **{k: row.get(k) for k in keep}}


PARTS = ("sampling", "update", "step")


def main() -> None:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--group", type=int, default=4, help="episodes per task (2 tasks)")
    p.add_argument("--max-turns", type=int, default=None, help="agent.max_turns (default: the recipe's)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"which of {','.join(PARTS)} to run (default: all): the update without the sampling part "
                        "samples its episodes together only (or reads --episodes)")
    p.add_argument("--update-sides", default="before,before_1row,after",
                   help=f"the update's sides, of {','.join(UPDATE_SIDES)} (default: the first three)")
    p.add_argument("--episodes", type=Path, default=None, metavar="JSON",
                   help="no sampling: the update's sides on an earlier run's episodes.json (its work folder)")
    p.add_argument("--synthetic", action="store_true",
                   help="the update on episodes of the bench's recorded shape with random tokens (synthetic_rows): "
                        "no warm start or sampling; memory as the sampled episodes' (give agent.model=smollm2-135m)")
    p.add_argument("--update-child", nargs=2, default=None, help=argparse_hidden())
    p.add_argument("overrides", nargs="*", help="more Hydra overrides of the recipe (after --)")
    args = p.parse_args()
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        p.error(f"--parts: unknown {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}")
    if unknown := set(args.update_sides.split(",")) - set(UPDATE_SIDES):
        p.error(f"--update-sides: unknown {', '.join(sorted(unknown))}; known: {', '.join(UPDATE_SIDES)}")
    if args.episodes and not args.episodes.is_file():
        p.error(f"--episodes: no file {args.episodes}")
    overrides = list(args.overrides) + ([f"agent.max_turns={args.max_turns}"] if args.max_turns else [])
    if args.update_child:
        update_child(args.update_child[0], args.update_child[1], overrides)
        return
    folder = C.workdir(args.workdir, "agent-step")
    conf = recipe_config(overrides)
    results: dict = {}
    claims: list = []
    rows_file = args.episodes
    if args.synthetic:
        from transformers import AutoConfig

        from agent_trainer.outer_loop.agents.agent_warm_start import resolve_agent

        vocab = AutoConfig.from_pretrained(resolve_agent(conf.agent.model, progress=False)).vocab_size
        rows_file = folder / "episodes.json"
        rows_file.write_text(json.dumps(synthetic_rows(vocab)))
    if "sampling" in parts or ("update" in parts and rows_file is None):
        claims += sampling_part(args, conf, folder, results, one_by_one="sampling" in parts)
        rows_file = folder / "episodes.json"
    if "update" in parts:
        claims += update_claims(rows_file, overrides, args.update_sides.split(","), results)
    if "step" in parts:
        print("3. one outer step of at-train experiment=smollm2_cpu, without the fixed-seed evaluations ...",
              flush=True)
        results["step"] = st = step_side(folder, overrides)
        print(json.dumps(st))
        if "seconds_step" in st:
            C.table([(k.removeprefix("seconds_"), st.get(k)) for k in STEP_SECONDS],
                    ("one outer step, no evaluations", "seconds"))
            print(f"at-train's own peak RSS over the step (sampling and update in one process): "
                  f"{st['at_train_peak_rss_gb']:.2f} GB")
        if "seconds_step" in st and st["seconds_step"] is not None:
            claims.append(C.ratio("agent_step_seconds", st["seconds_step"], "<= 360"))
    results["claims"] = claims
    C.write(args.json, "agent_step", results)


def sampling_part(args, conf, folder: Path, results: dict, one_by_one: bool) -> list:
    """Part 1: the sampling one by one (with ``one_by_one``) and together; the together side's episodes go to
    ``folder``/episodes.json for the update."""
    how = "one by one vs together" if one_by_one else "together (the update's episodes)"
    print(f"1. sampling {2 * args.group} episodes of {conf.agent.model}, {how} ...", flush=True)
    results["sampling"], rows = sampling_side(conf, folder, args.group, one_by_one)
    (folder / "episodes.json").write_text(json.dumps(rows))
    s = results["sampling"]
    C.table([(label, s[key]) for label, key in (("one by one", "one_by_one_s"), ("together", "together_s"))
             if key in s], ("sampling", "seconds"))
    print(f"{s['turns']} turns, {s['tokens_out']} tokens sampled, {s['tokens_in']} prompt tokens", flush=True)
    if not one_by_one:
        return []
    print(f"same episodes both ways: {s['same_episodes']} of {s['episodes']}")
    return [C.ratio("agent_sampling_batched", s["one_by_one_s"] / max(s["together_s"], 1e-9), ">= 3")]


def update_claims(rows_file: Path, overrides: list[str], sides: list[str], results: dict) -> list:
    """Part 2: the update of the episodes in ``rows_file``, each side of ``sides`` in its own process; the ratios."""
    print("2. the update of the same episodes: " + ", ".join(sides) + " ...", flush=True)
    results["update"] = u = update_side(rows_file, overrides, sides)
    C.table([(side, u[side].get("peak_rss_gb"), u[side].get("seconds"), u[side].get("loss"),
              u[side].get("error", "")) for side in u], ("update", "peak RSS GB", "seconds", "loss", ""))
    ok = {k: v for k, v in u.items() if "error" not in v}
    for side, v in ok.items():
        print(f"memory by phase, {side} (peak: the phase's high-water mark; what holds it at the phase's end):")
        M.print_table(v["phases"])
    claims = []
    before = next((ok[k] for k in ("before", "before_1row") if k in ok), None)
    if before is not None and "after" in ok:
        # Against the least memory the old update needs on these episodes (one row a micro-batch when the
        # recipe's rows did not fit in the machine at all).
        claims.append(C.ratio("agent_update_memory", before["peak_rss_gb"] / ok["after"]["peak_rss_gb"], ">= 2"))
        claims.append(C.ratio("agent_update_after_gb", ok["after"]["peak_rss_gb"], "<= 4"))
    for side in (k for k in ("after_shared_2k", "after") if k in ok and "after_unshared" in ok):
        seconds = ok["after_unshared"]["seconds"] / max(ok[side]["seconds"], 1e-9)
        claims.append(C.ratio(f"agent_update_{side}_over_unshared_speed", seconds, "> 1"))
    losses = [(k, v["loss"]) for k, v in ok.items()]
    if len(losses) > 1:
        same = all(abs(x - losses[0][1]) <= 1e-4 * max(1e-3, abs(losses[0][1])) for _, x in losses)
        print(f"same loss on every side: {same} ({', '.join(f'{k} {x:.6g}' for k, x in losses)})")
    return claims


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
