"""The validation probe's dry run: load the base model, try the first rows, score a few samples.

Called by ``agent_trainer.inner_loop.spec.validate.validate_job(..., dry_run=True)``; it adds findings to a report.
Library rewards are scored in an isolated child process (this module's ``main``, through
``agent_trainer.inner_loop.isolation.launcher``), agent-written ones in the sandboxed reward host
(``agent_trainer.inner_loop.isolation.reward_proxy``). docs/inner_loop.md, "Validation".
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

from agent_trainer.inner_loop.isolation import launcher as isolation
from agent_trainer.inner_loop.spec.cost import MAX_SEQUENCE_TOKENS, MAX_TOKEN_BYTES

SAMPLE_PROMPTS = 4  # GRPO prompts sampled in the dry run
SAMPLES_PER_PROMPT = 4  # one greedy + three sampled
SFT_ROWS = 8
CHILD_FILE_BYTES = 64 << 20  # the scoring child writes one small result file


def _loaders(models):
    """The model factory's loaders; plain transformers loading of a local folder until it has them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (getattr(models, "load_tokenizer", None) or AutoTokenizer.from_pretrained,
            getattr(models, "load_model", None) or AutoModelForCausalLM.from_pretrained)


def _load_base(report, spec, cache_dir, model_dir):
    """(tokenizer, model) of the job's base model, or None with a finding."""
    try:
        import agent_trainer.inner_loop.models as models

        path = Path(model_dir) if model_dir else models.resolve_model(spec.base_model, cache_dir=cache_dir)
        tokenizer, model = _loaders(models)
        tokenizer, model = tokenizer(path), model(path)
    except Exception as e:  # a missing real model, a broken cache: the agent can only pick another model
        report.add("base_model", f"base model {spec.base_model!r} could not be loaded here: {type(e).__name__}: {e}",
                   "use a tiny model (tiny-s or tiny-m) if the task allows it")
        return None
    model.eval()
    return tokenizer, model


def _probe_sft(report, spec, tokenizer, model, rows) -> None:
    import torch

    from agent_trainer.inner_loop.train.train import cut_sft_ids

    batch = rows[: min(SFT_ROWS, spec.hyperparameters.batch_size)]
    # Cut as the trainer cuts them: the dry run's cost in this, the harness, process is bounded by the cut.
    ids, labels = map(list, zip(*cut_sft_ids(tokenizer, batch)))
    if all(t == -100 for y in labels for t in y):
        # An error, not advice: training drops rows without loss, so a file of such rows leaves it no row at all.
        report.add("data", f"the first {len(batch)} rows' answers lie past the {MAX_SEQUENCE_TOKENS}-token cut of "
                   "the trainers: such rows train nothing", "shorten the prompts")
        return
    longest = max(map(len, ids))
    limit = getattr(model.config, "max_position_embeddings", 1024)
    if longest > limit:
        report.add("data", f"a row is {longest} tokens long; the model reads at most {limit}", "shorten the rows")
        return
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (longest - len(x)) for x in ids])
    label_t = torch.tensor([y + [-100] * (longest - len(y)) for y in labels])
    mask = torch.tensor([[1] * len(x) + [0] * (longest - len(x)) for x in ids])
    with torch.no_grad():
        loss = float(model(input_ids=input_ids, attention_mask=mask, labels=label_t).loss)
    report.probe["initial_loss"] = loss
    if not math.isfinite(loss):
        report.add("data", f"the first batch gives a non-finite loss ({loss})", "check the rows for odd text")


def prompt_batch(tokenizer, prompts: list[str], max_length: int = MAX_SEQUENCE_TOKENS) -> dict:
    """The prompts as one left-padded batch for ``generate``, each cut to its last ``max_length`` tokens (the end,
    where generation goes on), its characters first to the last ``max_length`` x ``MAX_TOKEN_BYTES``: the dry run
    runs in the harness process, and its cost is bounded by the trainers' cut, not the prompts' length (4 prompts
    of ~6,000 tokens took the harness ~415 MB and 4 s here). Prompts within the cut are the batch the tokenizer
    makes of them whole."""
    chars = max_length * MAX_TOKEN_BYTES
    ids = tokenizer([p[-chars:] for p in prompts], add_special_tokens=False)["input_ids"]
    return tokenizer.pad({"input_ids": [x[-max_length:] for x in ids]}, padding=True, padding_side="left",
                         return_tensors="pt")


def _sample(spec, tokenizer, model, prompts):
    """Greedy plus sampled completions: (completion texts, completion ids), grouped per prompt."""
    import torch

    hp = spec.hyperparameters
    enc = prompt_batch(tokenizer, prompts)
    common = dict(max_new_tokens=hp.max_completion_length, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(spec.seed)
    with torch.no_grad():
        greedy = model.generate(**enc, do_sample=False, **common)
        sampled = model.generate(**enc, do_sample=True, temperature=hp.temperature, top_k=0, top_p=1.0,
                                 num_return_sequences=SAMPLES_PER_PROMPT - 1, **common)
    width = enc["input_ids"].shape[1]
    texts, ids = [], []
    for i in range(len(prompts)):
        for seq in [greedy[i]] + [sampled[i * (SAMPLES_PER_PROMPT - 1) + j] for j in range(SAMPLES_PER_PROMPT - 1)]:
            out = seq[width:].tolist()
            if tokenizer.eos_token_id in out:  # TRL keeps the completion up to and including eos
                out = out[: out.index(tokenizer.eos_token_id) + 1]
            out = [t for t in out if t != tokenizer.pad_token_id]
            ids.append(out)
            texts.append(tokenizer.decode(out, skip_special_tokens=True))
    return texts, ids


def score_in_child(reward_spec, job_dir: Path, request: dict, timeout_s: float, sandbox=None) -> dict:
    """Run the job's rewards on ``request`` in a child process; returns the child's result or ``{"crash": why}``.

    Agent-written functions (``source: file``) run in a sandboxed reward host instead
    (``agent_trainer.inner_loop.isolation.reward_proxy``, under ``sandbox``: a ``SandboxPolicy``, a bool or None)."""
    if any(f.source == "file" for f in reward_spec.functions):
        from agent_trainer.inner_loop.isolation.reward_proxy import score_with_host
        from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy

        return score_with_host(reward_spec, job_dir, request, timeout_s, SandboxPolicy.coerce(sandbox))
    with tempfile.TemporaryDirectory(prefix="reward-probe-") as tmp:
        req, res, err_path = Path(tmp) / "request.json", Path(tmp) / "result.json", Path(tmp) / "stderr.txt"
        req.write_text(json.dumps(dict(request, reward=reward_spec.model_dump())))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1"}
        cpu = int(timeout_s) + 5
        with open(err_path, "wb") as err:
            proc = isolation.start(isolation.python_module("agent_trainer.inner_loop.spec.probe", str(req), str(res)),
                                   cwd=tmp, env=env, agent_dirs=[job_dir], stderr=err,
                                   limits={"RLIMIT_CPU": cpu, "RLIMIT_FSIZE": CHILD_FILE_BYTES})
            try:
                proc.wait(timeout=timeout_s)
            except isolation.TimeoutExpired:
                isolation.kill_group(proc.pid)
                proc.wait()
                return {"crash": f"the reward functions did not finish within {timeout_s:g} s on "
                                 f"{len(request['completions'])} completions"}
        if not res.is_file():
            tail = " ".join(err_path.read_text(errors="replace").strip().splitlines()[-3:])[-600:]
            return {"crash": f"the reward process exited with code {proc.returncode} without a result: {tail}"}
        return json.loads(res.read_text())


def _probe_grpo(report, spec, tokenizer, model, rows, job_dir: Path, timeout_s: float, sandbox=None) -> None:
    hp = spec.hyperparameters
    picked = rows[:SAMPLE_PROMPTS]
    need = max(len(tokenizer(r["answer"], add_special_tokens=False)["input_ids"]) + 1 for r in rows[:64])
    if need > hp.max_completion_length:
        report.add("hyperparameters.max_completion_length", f"answers need up to {need} tokens (with eos) but "
                   f"max_completion_length is {hp.max_completion_length}: correct answers get cut off",
                   f"set max_completion_length: {need + 2} or more", "warning")
    texts, ids = _sample(spec, tokenizer, model, [r["prompt"] for r in picked])
    expanded = [r for r in picked for _ in range(SAMPLES_PER_PROMPT)]
    columns = {k: [r.get(k) for r in expanded] for k in picked[0] if k != "prompt"}
    request = {"prompts": [r["prompt"] for r in expanded], "completions": texts, "completion_ids": ids,
               "columns": columns, "max_steps": hp.max_steps}
    result = score_in_child(spec.reward, job_dir, request, timeout_s, sandbox)
    if "crash" in result or "load_error" in result:
        report.add("reward.file", result.get("crash") or result["load_error"],
                   "fix the reward code so it imports and returns one float per completion quickly")
        return
    for i, f in enumerate(spec.reward.functions):
        if f.name in result["errors"]:
            report.add(f"reward.functions.{i}", f"reward {f.name!r} failed on the dry-run samples: "
                       f"{result['errors'][f.name]}", "fix it; it is called as f(prompts, completions, **kwargs) "
                       "with kwargs answer, family, completion_ids, trainer_state")
    if result["errors"]:
        return
    values = result["values"]
    for i, f in enumerate(spec.reward.functions):
        if all(v is None for v in values[f.name]):
            report.add(f"reward.functions.{i}", f"reward {f.name!r} returned None (does not apply) for every "
                       "sample", "pick a reward that fits this task's answers", "warning")
    # TRL sums weighted rewards with nansum: a None counts as 0.
    totals = [round(sum(f.weight * (values[f.name][k] or 0.0) for f in spec.reward.functions), 4)
              for k in range(len(texts))]
    groups = [totals[g:g + SAMPLES_PER_PROMPT] for g in range(0, len(totals), SAMPLES_PER_PROMPT)]
    report.probe["reward_spread"] = round(max(totals) - min(totals), 4)
    report.probe["groups_without_spread"] = sum(max(g) == min(g) for g in groups) / len(groups)
    report.probe["samples"] = [
        {"prompt": request["prompts"][k], "completion": texts[k], "total": totals[k],
         "rewards": {f.name: values[f.name][k] for f in spec.reward.functions}} for k in range(len(texts))]
    if max(totals) == min(totals):
        report.add("reward", f"the reward is {totals[0]} for all {len(totals)} dry-run samples: GRPO cannot learn "
                   "from a reward with no spread", "add a partial-credit reward (numeric_closeness, token_overlap, "
                   "format_ok) or check that the reward reads the answer column", "warning")


def dry_run(report, spec, job_dir: Path, rows: list[dict], *, reward_timeout_s: float, cache_dir=None,
            model_dir=None, sandbox=None, fmt=None) -> None:
    """Probe the job on its base model, its prompts in the task's format ``fmt`` (``agent_trainer.evaluation.prompts``);
    adds findings and ``report.probe`` entries. ``reward_timeout_s``: the sandbox policy's
    (``inner.reward_timeout_s``)."""
    from agent_trainer.evaluation.prompts import RAW, PromptFormatError, render

    loaded = _load_base(report, spec, cache_dir, model_dir)
    if loaded is None:
        return
    import torch

    tokenizer, model = loaded
    try:
        rows = [{**r, "prompt": render(tokenizer, r["prompt"], fmt or RAW)} for r in rows]
    except PromptFormatError as e:
        report.add("base_model", f"base model {spec.base_model!r}: {e}", "pick a model with a chat template")
        return
    report.probe["model_parameters"] = sum(p.numel() for p in model.parameters())
    # One thread: the probe's tensors are tiny, and on a busy shared machine two threads are ~30x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if spec.algorithm == "sft":
            _probe_sft(report, spec, tokenizer, model, rows)
        else:
            _probe_grpo(report, spec, tokenizer, model, rows, Path(job_dir), reward_timeout_s, sandbox)
    finally:
        torch.set_num_threads(threads)


# --- the scoring child (library rewards only) ----------------------------------------------------


def score_main(request_path: str, result_path: str) -> int:
    """Score the request's completions with its (library) rewards; writes ``{"values", "errors"}`` or ``load_error``."""
    import types

    from agent_trainer.inner_loop.spec.jobspec import RewardSpec
    from agent_trainer.inner_loop.train.rewards import RewardError, resolve_rewards

    request = json.loads(Path(request_path).read_text())
    result: dict = {"values": {}, "errors": {}}
    funcs = []
    try:
        spec = RewardSpec.model_validate(request["reward"])
        agent = [f.name for f in spec.functions if f.source != "library"]
        if agent:  # never imported here: no job folder is even known to this process
            raise RewardError(f"reward {agent[0]!r} is agent code; it runs in the reward host, not here")
        funcs = resolve_rewards(spec, job_dir=".")
    except Exception as e:
        result["load_error"] = str(e) if isinstance(e, RewardError) else f"{type(e).__name__}: {e}"
        funcs = []
    state = types.SimpleNamespace(global_step=0, max_steps=request.get("max_steps", 1), epoch=0.0)
    for name, fn, _ in funcs:
        try:
            result["values"][name] = fn(prompts=request["prompts"], completions=request["completions"],
                                        completion_ids=request.get("completion_ids"), trainer_state=state,
                                        log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None,
                                        **request["columns"])
        except Exception as e:
            result["errors"][name] = (str(e) if isinstance(e, RewardError) else f"{type(e).__name__}: {e}")[-800:]
    Path(result_path).write_text(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return score_main(argv[0], argv[1])


if __name__ == "__main__":
    sys.exit(main())
