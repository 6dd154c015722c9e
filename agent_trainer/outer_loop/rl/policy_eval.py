"""A run's policy played again on fixed tasks: the warm start and saved checkpoints on the same episode seeds,
with no update, so the difference between two of them is the training's alone.

A run's training reward (last steps minus first) also moves with which tasks its steps drew; this plays every
task of a family set ``episodes`` times with each policy, on the held-out evaluation's fixed seeds
(``heldout.SEED_BASE``), and pairs the episodes: episode ``g`` of task ``i`` has the same seed under every policy.
Played on the held-out families with the run's own ``heldout_episodes`` it gives back the run's held-out start
and end rewards exactly.

    >>> out = evaluate_runs(["runs/<run>"], families="train", episodes=4, steps=["start", "last"])
    >>> out["runs"][0]["gain"]      # {"from": "start", "to": 11, "gain": ..., "lo": ..., "hi": ...}

``scripts/policy_eval.py`` is its command line; docs/evaluation.md, "Three seeds and a seed report".
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from agent_trainer.outer_loop.rl import heldout
from agent_trainer.outer_loop.rl.checkpoints import CKPT_DIR, last_complete_step

START, LAST = "start", "last"
EVALS_DIR = "evals"     # <run>/evals/<families>_e<episodes>/: the evaluations' episodes and results
RESULT_FILE = "policy_eval.json"


def write_json(path: Path, data: Any) -> None:
    """``data`` to ``path`` whole or not at all (a kill mid-write leaves the previous file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def saved_metrics(run_dir: Path) -> dict[str, float]:
    """``paired_metrics`` of every evaluation saved in a run folder (a run made with tracking off); of two on the
    same families, the one with more episodes."""
    out: dict[str, float] = {}
    files = sorted(Path(run_dir).glob(f"{EVALS_DIR}/*/{RESULT_FILE}"))
    rows = []
    for f in files:
        try:
            rows.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    for row in sorted(rows, key=lambda r: r.get("episodes", 0)):
        out.update(paired_metrics(row))
    return out


def run_config(run_dir: Path):
    """The run's validated config: at-train's schema and defaults with the run's ``config.resolved.yaml`` on top
    (its keys this version does not have are left out)."""
    from omegaconf import DictConfig, OmegaConf

    from agent_trainer.cli_args import UserError
    from agent_trainer.config import ConfigError, compose_config, typed

    path = Path(run_dir) / "config.resolved.yaml"
    if not path.is_file():
        raise UserError(f"{run_dir}: not an at-train run folder (no config.resolved.yaml)")

    def known(saved: DictConfig, now: DictConfig) -> dict:
        return {k: known(v, now[k]) if isinstance(v, DictConfig) and isinstance(now.get(k), DictConfig)
                and k != "base_models" else v for k, v in saved.items() if k in now}

    base = compose_config([], "train")
    try:
        return typed(OmegaConf.merge(base, known(OmegaConf.load(path), base)))
    except ConfigError as e:
        raise UserError(f"{path}: {e}") from None


def checkpoint(run_dir: Path, step: str | int) -> tuple[int, Path | None]:
    """``(step number, checkpoint folder)`` of ``step``: ``start`` (the warm start, before any update: None),
    ``last`` (the newest complete checkpoint) or a step number."""
    from agent_trainer.cli_args import UserError

    if step == START:
        return -1, None
    folder = last_complete_step(run_dir) if step == LAST else Path(run_dir) / CKPT_DIR / f"step_{int(step):04d}"
    if folder is None or not (folder / "adapter").is_dir():
        have = sorted(p.name for p in (Path(run_dir) / CKPT_DIR).glob("step_*"))
        raise UserError(f"{run_dir}: no checkpoint for step {step} (it has {', '.join(have) or 'none'})")
    return step_of(folder), folder


def step_of(folder: Path | None) -> int | None:
    """The step number of a checkpoint folder (``step_0011``: 11); None for none."""
    return int(folder.name.split("_")[1]) if folder is not None else None


def family_tasks(cfg, families: str) -> list[str]:
    """Task spec paths: ``train`` (the run's training families), ``heldout`` (its held-out ones), ``all`` (both)
    or family names separated by commas."""
    from agent_trainer.outer_loop.rl.run_config import spec_paths, train_settings

    from agent_trainer.cli_args import UserError
    from agent_trainer.paths import resolve_path

    settings = train_settings(cfg)
    if families == "train":
        paths = settings.train_tasks
    elif families == "heldout":
        paths = settings.heldout_tasks
    elif families == "all":
        paths = [*settings.train_tasks, *settings.heldout_tasks]
    else:
        paths = spec_paths(cfg, [f.strip() for f in families.split(",") if f.strip()])
    missing = [p for p in paths if not resolve_path(p).is_file()]
    if missing:
        raise UserError(f"--families {families}: no task spec at {', '.join(missing)} (the run's "
                        f"task.spec_pattern is {cfg.task.spec_pattern})")
    return paths


def load_adapter(policy, folder: Path | None) -> None:
    """Give ``policy`` the adapter saved in ``folder`` (None: zero, the warm start itself)."""
    import torch
    from peft import load_peft_weights, set_peft_model_state_dict

    if folder is None:
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.zero_()
        return
    result = set_peft_model_state_dict(policy.model, load_peft_weights(str(folder / "adapter")))
    if result.unexpected_keys:
        raise ValueError(f"{folder}: the adapter does not fit the run's LoRA ({result.unexpected_keys[:3]} ...)")


def start_key(cfg, tasks: Sequence[str], episodes: int) -> str:
    """What the warm start's evaluation depends on: two runs with the same key play it identically (a fresh
    LoRA adds exactly 0), so it is played once."""
    from omegaconf import OmegaConf

    c = OmegaConf.structured(cfg)
    parts = {k: OmegaConf.to_container(c[k], resolve=True) for k in ("agent", "task", "budget", "inner", "strategy")}
    parts["reward"] = OmegaConf.to_container(c.outer.reward, resolve=True)
    return json.dumps({**parts, "tasks": list(tasks), "episodes": episodes}, sort_keys=True, default=str)


def summarize_eval(metrics: dict[str, Any], tasks: Sequence, episodes: int, seconds: float) -> dict[str, Any]:
    """One policy's evaluation: its rewards (task by task, ``episodes`` each, in order), their mean with its
    interval, per-family means, the episode metrics (valid at the first try, shares) and the seconds."""
    p = heldout.PREFIX
    rewards = metrics[p + heldout.REWARDS]
    fam = {t.family: sum(rewards[i * episodes:(i + 1) * episodes]) / episodes for i, t in enumerate(tasks)}
    numbers = {k[len(p):]: v for k, v in metrics.items() if k.startswith(p) and isinstance(v, float)}
    return {"rewards": rewards, "families": fam, "seconds": round(seconds, 1), **numbers}


def gain(before: dict, after: dict, names: tuple[str, str]) -> dict[str, Any]:
    """The paired gain of ``after`` over ``before`` (same episodes) with its bootstrap 95% interval."""
    from agent_trainer.outer_loop.report.bootstrap import paired_diff_ci

    g, lo, hi = paired_diff_ci(before["rewards"], after["rewards"])
    return {"from": names[0], "to": names[1], "gain": g, "lo": lo, "hi": hi,
            "families": {f: after["families"][f] - before["families"][f] for f in before["families"]}}


def label(families: str) -> str:
    """The family set's name in folder and metric names: ``train``, ``heldout``, or the names joined by ``-``."""
    return "-".join(f.strip() for f in families.split(",") if f.strip())


def paired_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A run's evaluation as at-train-style metrics, when its gain is the run's last policy's over the warm start:
    ``paired_<label>_start``, ``_end``, ``_gain``, ``_gain_lo``, ``_gain_hi``, ``_episodes`` (per task)."""
    g = row.get("gain")
    if not g or g["from"] != START or g["to"] != str(row.get("last_step")) or not row.get("label"):
        return {}
    ev = row["evaluations"]
    return heldout.paired_names(row["label"], ev[START]["reward_mean"], ev[g["to"]]["reward_mean"], g["gain"],
                                g["lo"], g["hi"], row["episodes"])


def log_to_run(run_dir: Path, cfg, metrics: dict[str, float], step: int) -> str:
    """Add ``metrics`` to the run's own MLflow run (at-compare reads them there; a run made with tracking off
    is read from its folder instead). Returns what happened, in words; never fails the evaluation."""
    marker = Path(run_dir) / "outer_run.json"
    run_id = json.loads(marker.read_text()).get("mlflow_run_id") if marker.is_file() else None
    if not metrics or not cfg.tracking.enabled or not run_id:
        return "not logged to MLflow (the run has no MLflow run)"
    from agent_trainer.tracking import Tracker, metric_key

    uri = cfg.tracking.tracking_uri
    try:
        tracker = Tracker(uri, connect_timeout_s=cfg.tracking.connect_timeout_s).attach(run_id, reopen=False)
        tracker.log_metrics({metric_key(k): v for k, v in metrics.items()}, step=step)
    except Exception as e:   # the results are in the run folder either way
        return f"not logged to MLflow ({' '.join(str(e).split())[:200]})"
    return f"logged to MLflow run {run_id} ({uri})"


class RunEvaluator:
    """Builds a run's trainer once (its policy, sampler, executor and ledger, in ``<run>/evals/<label>/``) and
    plays the family set with each policy asked for."""

    def __init__(self, run_dir: Path, families: str, episodes: int, progress: bool = True):
        from agent_trainer.outer_loop.rl.run_config import (
            agent_dir, make_executor, make_ledger, make_sampler, policy_device, set_agent_threads,
            steering_factory, train_settings,
        )
        from agent_trainer.outer_loop.rl.train import Trainer, load_tasks

        self.run_dir, self.episodes = Path(run_dir), episodes
        self.cfg = c = run_config(self.run_dir)
        self.task_paths = family_tasks(c, families)
        if not self.task_paths:
            from agent_trainer.cli_args import UserError

            raise UserError(f"{run_dir}: the run has no {families} families")
        self.tasks = load_tasks(self.task_paths)
        self.label = label(families)
        self.out = self.run_dir / EVALS_DIR / f"{self.label}_e{episodes}"
        # An evaluation again starts afresh: no earlier one's episodes, nor its spending against the run's budget
        # caps (policy_eval.json stays until the new one replaces it).
        shutil.rmtree(self.out / "episodes", ignore_errors=True)
        (self.out / "ledger.jsonl").unlink(missing_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        set_agent_threads(c)
        ledger = make_ledger(c, self.out)
        agent = agent_dir(c)
        self.trainer = Trainer(train_settings(c), self.out, agent, ledger=ledger, executor=make_executor(c),
                               model_name=c.agent.model, steering=steering_factory(c, self.out, ledger),
                               sampler=make_sampler(c, agent), agent_device=policy_device(c),
                               tool_format=c.agent.tool_format, progress=progress)

    def play(self, step: str | int) -> tuple[int, dict[str, Any]]:
        """``(step number, evaluation)`` of the policy at ``step`` (``start``, ``last`` or a number)."""
        from agent_trainer.outer_loop.rl.rollouts import evaluate_fixed

        number, folder = checkpoint(self.run_dir, step)
        load_adapter(self.trainer.policy, folder)
        self.trainer.sync_sampler()
        t0 = time.time()
        # episode folders s<updates>-heldout-<task>-<g>: s0000 the warm start, s0012 after step 11's update
        metrics = evaluate_fixed(self.trainer.rollouts, self.tasks, self.episodes, number + 1, heldout.PREFIX)
        return number, summarize_eval(metrics, self.tasks, self.episodes, time.time() - t0)

    def play_backend(self, backend, folder_step: int) -> dict[str, Any]:
        """The family set played by another ``backend`` (a scripted agent: a person's job, the novice) on the same
        seeds, tools, budget and jobs as the run's policy; its episodes in folders ``s<folder_step>-heldout-...``
        (a number no policy of the run uses)."""
        from agent_trainer.outer_loop.rl.rollouts import evaluate_fixed

        t0 = time.time()
        metrics = evaluate_fixed(self.trainer.rollouts.with_backend(backend), self.tasks, self.episodes,
                                 folder_step, heldout.PREFIX)
        return summarize_eval(metrics, self.tasks, self.episodes, time.time() - t0)

    def episode_summaries(self, folder_step: int) -> list[dict[str, Any]]:
        """The ``summary.json`` of every episode played into folders ``s<folder_step>-...``, task by task and
        episode by episode (the order of the rewards); ``play`` of step n writes ``s<n + 1>``."""
        tag = heldout.HELDOUT.tag_of(heldout.PREFIX)
        folder = self.out / "episodes"
        return [json.loads((folder / f"s{folder_step:04d}-{tag}-{t.name}-{g}" / "summary.json").read_text())
                for t in self.tasks for g in range(self.episodes)]

    def close(self) -> None:
        self.trainer.close()


def check_runs(runs: Sequence[str | Path], families: str, steps: Sequence[str | int]) -> None:
    """A folder that is no run, a step without its checkpoint or a family set the run lacks: a ``UserError`` (one
    line) before any policy is built or played, and before the training code is imported."""
    from agent_trainer.cli_args import UserError

    for run in runs:
        cfg = run_config(Path(run))
        for step in steps:
            checkpoint(Path(run), step)
        if not family_tasks(cfg, families):
            raise UserError(f"{run}: the run has no {families} families")


def evaluate_runs(runs: Sequence[str | Path], families: str, episodes: int,
                  steps: Sequence[str | int] = (START, LAST), progress: bool = True) -> dict[str, Any]:
    """Each run's policies at ``steps`` played on the family set, each run's paired gain of its last listed step
    over its first, and (several runs) the mean gain with its t interval, runs as the unit. Each run's results
    also go to ``<run>/evals/<label>/policy_eval.json``."""
    from agent_trainer.outer_loop.report.bootstrap import t_interval

    check_runs(runs, families, steps)
    shared: dict[str, dict] = {}
    out_runs = []
    for run in runs:
        ev = RunEvaluator(Path(run), families, episodes, progress=progress)
        try:
            played: dict[str, dict] = {}
            for step in steps:
                key = start_key(ev.cfg, ev.task_paths, episodes) if step == START else None
                if key is not None and key in shared:
                    played[START] = {**shared[key], "shared_with": shared[key]["run"]}
                    continue
                if progress:
                    print(f"{run}: the policy at {step}, {len(ev.tasks)} tasks x {episodes} episodes ...",
                          file=sys.stderr, flush=True)
                number, result = ev.play(step)
                name = START if number < 0 else str(number)
                if progress:
                    print(f"{run}: {name}: reward {result['reward_mean']:.3f} ({result['seconds']:.0f} s)",
                          file=sys.stderr, flush=True)
                played[name] = {"run": str(run), **result}
                if key is not None:
                    shared[key] = played[name]
        finally:
            ev.close()
        names = list(played)
        row = {"run": str(run), "seed": ev.cfg.seed, "label": ev.label, "families": [t.family for t in ev.tasks],
               "episodes": episodes, "last_step": step_of(last_complete_step(ev.run_dir)), "evaluations": played}
        if len(names) >= 2:
            row["gain"] = gain(played[names[0]], played[names[-1]], (names[0], names[-1]))
        write_json(ev.out / RESULT_FILE, row)
        if row.get("gain"):
            metrics = paired_metrics(row)
            note = (log_to_run(ev.run_dir, ev.cfg, metrics, row["last_step"] + 1) if metrics else
                    "not logged to MLflow (at-compare shows the last policy's gain over the warm start)")
            if progress:
                print(f"{run}: {ev.out / RESULT_FILE}; {note}", file=sys.stderr, flush=True)
        out_runs.append(row)
    result: dict[str, Any] = {"runs": out_runs}
    gains = [r["gain"]["gain"] for r in out_runs if "gain" in r]
    if len(gains) >= 2:
        ci = t_interval(gains)
        result["mean_gain"] = {"gain": sum(gains) / len(gains), "lo": ci[0], "hi": ci[1], "runs": len(gains)}
    return result


def markdown(result: dict[str, Any]) -> str:
    """A table: per run, each policy's mean reward, valid at the first try and the paired gain; then the mean."""
    lines = ["| run | seed | policy | reward [95%] | valid first try | SFT share | gain, paired [95%] |",
             "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        for name, e in r["evaluations"].items():
            g = r.get("gain") if name == r.get("gain", {}).get("to") else None
            lines.append(f"| {r['run']} | {r['seed']} | {name} | {e['reward_mean']:.3f} [{e['reward_lo']:.3f}, "
                         f"{e['reward_hi']:.3f}] | {e.get('valid_first_try', 0):.2f} | "
                         f"{e.get('share_algorithm_sft', 0):.2f} | "
                         + (f"**{g['gain']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}]**" if g else "") + " |")
    m = result.get("mean_gain")
    if m:
        lines.append(f"| **mean over {m['runs']} runs** (t interval) | | | | | | **{m['gain']:+.3f} "
                     f"[{m['lo']:+.3f}, {m['hi']:+.3f}]** |")
    fams = [r for r in result["runs"] if "gain" in r]
    if fams:
        names = list(fams[0]["gain"]["families"])
        lines += ["", "| run | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for r in fams:
            lines.append(f"| {r['run']} | " + " | ".join(f"{r['gain']['families'][f]:+.3f}" for f in names) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> Path:
    """``policy_eval.png``: each run's mean reward on the family set against the updates its policy had (0: the
    warm start), with its 95% interval; with several runs, their mean too."""
    from agent_trainer.outer_loop.report.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    curves: dict[int, list[float]] = {}
    for i, r in enumerate(result["runs"]):
        pts = sorted((0 if name == START else int(name) + 1, e["reward_mean"], e["reward_lo"], e["reward_hi"])
                     for name, e in r["evaluations"].items())
        x, y = [p[0] for p in pts], [p[1] for p in pts]
        shift = (i - (len(result["runs"]) - 1) / 2) * 0.08
        ax.errorbar([v + shift for v in x], y, yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    fmt="o-", capsize=3, alpha=0.8, label=f"seed {r['seed']}")
        for xi, yi in zip(x, y):
            curves.setdefault(xi, []).append(yi)
    if len(result["runs"]) > 1:
        xs = sorted(curves)
        ax.plot(xs, [sum(curves[x]) / len(curves[x]) for x in xs], "k--", linewidth=2, label="mean over seeds")
    first = result["runs"][0]
    ax.set(xlabel="updates (0: the warm start)", ylabel="mean episode reward",
           title=f"{ {'train': 'training', 'heldout': 'held-out'}.get(first['label'], first['label'])} families, "
                 f"{first['episodes']} episodes a task, the same seeds at every point")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
