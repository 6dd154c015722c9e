"""The seed report of ``at-compare``: one row per seed of at-train runs, and their mean ± sd.

    >>> runs = collect(uri, ["runs/<sweep id>"])          # e.g. at-train -m seed=0,1,2 hydra/launcher=joblib
    >>> write_seed_report(runs, "runs/<compare run>")    # seeds.md, .csv, .png (only when the runs differ in seed)

Numbers from MLflow only (``agent_trainer.outer_loop.report.compare_runs.collect``). The columns: docs/evaluation.md,
"Three seeds and a seed report".
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any, Sequence

from agent_trainer.outer_loop.report.bootstrap import ci_text, t_interval
from agent_trainer.outer_loop.report.compare import RunData, differing_keys, short_names

K = 3            # first / last steps, as at-train's summary
GAIN_BAR = 0.10  # the training gain a seed should clear
NUMBERS = ("reward_first3", "reward_last3", "reward_gain", "heldout_start", "heldout_end", "heldout_gain",
           "share_algorithm_sft_first3", "share_algorithm_sft_last3", "valid_first_try_first3",
           "valid_first_try_last3", "paired_train_start", "paired_train_end", "paired_train_gain")
# The training families played on the same seeds by the warm start and the run's last policy (in the run:
# outer.train_eval_episodes; after it: scripts/policy_eval.py, agent_trainer.outer_loop.rl.policy_eval.paired_metrics);
# None where not evaluated.
PAIRED = ("paired_train_start", "paired_train_end", "paired_train_gain", "paired_train_gain_lo",
          "paired_train_gain_hi", "paired_train_episodes")
CSV_COLUMNS = ("setting", "seed", "run", "run_id", *NUMBERS[:3], "reward_gain_lo", "reward_gain_hi", NUMBERS[3],
               "heldout_start_lo", "heldout_start_hi",
               "heldout_end", "heldout_end_lo", "heldout_end_hi", "heldout_gain", "heldout_gain_lo",
               "heldout_gain_hi", *NUMBERS[6:10], *PAIRED)


def wanted(runs: Sequence[RunData]) -> bool:
    """Whether the runs differ in ``seed`` (the report is written only then)."""
    return "seed" in differing_keys(runs)


def _first_last(points: list[tuple[int, float]] | None, k: int = K) -> tuple[float | None, float | None]:
    if not points:
        return None, None
    values = [v for _, v in sorted(points)]
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


def _at(points: list[tuple[int, float]] | None, step: int | None) -> float | None:
    return next((v for s, v in points or [] if s == step), None) if step is not None else None


def seed_row(run: RunData) -> dict[str, Any]:
    """One run's numbers (``NUMBERS`` and the held-out intervals; None where the run has none)."""
    h = run.history
    reward = h.get("reward_mean") or []
    row: dict[str, Any] = {"seed": run.params.get("seed"), "run": run.name, "run_id": run.run_id}
    row["reward_first3"], row["reward_last3"] = _first_last(reward)
    row["reward_gain"] = (row["reward_last3"] - row["reward_first3"]) if reward else None
    held = h.get("heldout_reward_mean") or []
    steps = [s for s, _ in held]
    last_train = max((s for s, _ in reward), default=None)
    # start: step 0 (before any update); end: one past the last training step (after the last update)
    ends = {"start": 0 if 0 in steps else None,
            "end": last_train + 1 if last_train is not None and last_train + 1 in steps else None}
    for name, step in ends.items():
        row[f"heldout_{name}"] = _at(held, step)
        row[f"heldout_{name}_lo"] = _at(h.get("heldout_reward_lo"), step)
        row[f"heldout_{name}_hi"] = _at(h.get("heldout_reward_hi"), step)
    for key in ("reward_gain_lo", "reward_gain_hi", "heldout_gain", "heldout_gain_lo", "heldout_gain_hi"):
        row[key] = run.metrics.get(key)
    # at-train logs a choice's share only at steps where some episode made it: a missing step is 0
    sft = dict(h.get("share_algorithm_sft") or [])
    row["share_algorithm_sft_first3"], row["share_algorithm_sft_last3"] = _first_last(
        [(s, sft.get(s, 0.0)) for s, _ in reward])
    row["valid_first_try_first3"], row["valid_first_try_last3"] = _first_last(h.get("valid_first_try"))
    row.update({k: run.metrics.get(k) for k in PAIRED})
    return row


def per_seed(rows: Sequence[dict]) -> list[dict]:
    """One row per distinct seed: a seed run more than once (a rerun, a second sweep over the same seeds) is one
    sample of the recipe, not several, so its runs' numbers are averaged (a deterministic rerun's are equal)."""
    by_seed: dict[str, list[dict]] = {}
    for r in rows:
        by_seed.setdefault(str(r.get("seed")), []).append(r)
    out = []
    for seed, group in by_seed.items():
        row: dict[str, Any] = {"seed": group[0].get("seed"), "runs": len(group)}
        for key in {k for r in group for k in r} - {"seed", "run", "run_id"}:
            vals = [r[key] for r in group if isinstance(r.get(key), (int, float))]
            row[key] = statistics.fmean(vals) if vals else None
        out.append(row)
    return out


def summary_row(rows: Sequence[dict]) -> dict[str, Any]:
    """Mean and sd (n - 1) over the seeds of each of ``NUMBERS``, the 95% t interval of the mean training and
    held-out gains (seeds as the unit: what a fresh seed of the recipe can be expected to gain), and the counts
    of clear gains; a seed with several runs counts once (``per_seed``)."""
    out: dict[str, Any] = {"runs": len(rows)}
    rows = per_seed(rows)
    out["seeds"] = len(rows)
    for key in NUMBERS:
        vals = [r[key] for r in rows if r.get(key) is not None]
        out[f"{key}_mean"] = statistics.fmean(vals) if vals else None
        out[f"{key}_sd"] = statistics.stdev(vals) if len(vals) > 1 else None
    for key in ("reward_gain", "heldout_gain", "paired_train_gain"):
        ci = t_interval([r[key] for r in rows if r.get(key) is not None])
        out[f"{key}_mean_lo"], out[f"{key}_mean_hi"] = ci if ci else (None, None)
    out["gain_above_bar"] = sum(1 for r in rows if r.get("reward_gain") is not None and r["reward_gain"] > GAIN_BAR)
    out["gain_above_0"] = sum(1 for r in rows if r.get("reward_gain_lo") is not None and r["reward_gain_lo"] > 0)
    known = [r["heldout_gain_lo"] for r in rows if r.get("heldout_gain_lo") is not None]
    out["heldout_gain_above_0"], out["heldout_gain_known"] = sum(1 for lo in known if lo > 0), len(known)
    paired = [r["paired_train_gain_lo"] for r in rows if r.get("paired_train_gain_lo") is not None]
    out["paired_train_gain_above_0"], out["paired_train_gain_known"] = sum(1 for lo in paired if lo > 0), len(paired)
    return out


def _seed_order(row: dict) -> tuple:
    seed = str(row.get("seed"))
    return (0, int(seed), "") if seed.lstrip("-").isdigit() else (1, 0, seed)


def settings(runs: Sequence[RunData]) -> list[tuple[str, list[RunData]]]:
    """The runs grouped by their differing params other than ``seed`` (``[("", runs)]`` when only seeds differ)."""
    keys = [k for k in differing_keys(runs) if k != "seed"]
    short = short_names(keys)
    groups: dict[str, list[RunData]] = {}
    for r in runs:
        groups.setdefault(" ".join(f"{short[k]}={r.params.get(k, '-')}" for k in keys), []).append(r)
    return list(groups.items())


def _num(v: Any, signed: bool = False) -> str:
    return "-" if v is None else (f"{v:+.3f}" if signed else f"{v:.3f}")


def _arrow(a: Any, b: Any) -> str:
    return "-" if a is None and b is None else f"{_num(a)} -> {_num(b)}"


def _pm(s: dict, key: str, signed: bool = False) -> str:
    mean, sd = s[f"{key}_mean"], s[f"{key}_sd"]
    return "-" if mean is None else _num(mean, signed) + ("" if sd is None else f" ± {sd:.3f}")


def _meanci_text(s: dict, key: str) -> str:
    return ci_text(s[f"{key}_mean"], s[f"{key}_mean_lo"], s[f"{key}_mean_hi"], True)


MD_HEADER = ("seed", "reward first3 -> last3", "training gain", "held-out start [95% CI]", "held-out end [95% CI]",
             "held-out gain, paired [95% CI]", "SFT share first3 -> last3", "valid first try first3 -> last3", "run")


def markdown(groups: Sequence[tuple[str, list[dict], dict]]) -> str:
    """``seeds.md``: per setting, a row per seed and the mean ± sd row."""
    lines = ["# Seeds", "",
             f"Training gain: mean reward of the last {K} steps minus the first {K}, its interval a bootstrap over "
             "those steps' episodes (each side resampled on its own). Held-out: the same episode "
             "seeds at the start (before any update) and the end (after the last update); the gain is their "
             "paired difference, its interval a paired bootstrap over episodes (2000 resamples).", ""]
    for name, rows, s in groups:
        if name:
            lines += [f"## {name}", ""]
        lines += ["| " + " | ".join(MD_HEADER) + " |", "|" + "---|" * len(MD_HEADER)]
        for r in rows:
            cells = (str(r["seed"]), _arrow(r["reward_first3"], r["reward_last3"]),
                     ci_text(r["reward_gain"], r["reward_gain_lo"], r["reward_gain_hi"], True),
                     ci_text(r["heldout_start"], r["heldout_start_lo"], r["heldout_start_hi"]),
                     ci_text(r["heldout_end"], r["heldout_end_lo"], r["heldout_end_hi"]),
                     ci_text(r["heldout_gain"], r["heldout_gain_lo"], r["heldout_gain_hi"], True),
                     _arrow(r["share_algorithm_sft_first3"], r["share_algorithm_sft_last3"]),
                     _arrow(r["valid_first_try_first3"], r["valid_first_try_last3"]), str(r["run"]).replace("|", "/"))
            lines.append("| " + " | ".join(cells) + " |")
        cells = (f"mean ± sd ({s['seeds']} seeds)",
                 f"{_pm(s, 'reward_first3')} -> {_pm(s, 'reward_last3')}", _pm(s, "reward_gain", True),
                 _pm(s, "heldout_start"), _pm(s, "heldout_end"), _pm(s, "heldout_gain", True),
                 f"{_pm(s, 'share_algorithm_sft_first3')} -> {_pm(s, 'share_algorithm_sft_last3')}",
                 f"{_pm(s, 'valid_first_try_first3')} -> {_pm(s, 'valid_first_try_last3')}", "")
        lines += ["| " + " | ".join(f"**{c}**" if c else c for c in cells) + " |", "",
                  f"Seeds with a training gain above {GAIN_BAR:.2f}: **{s['gain_above_bar']} of {s['seeds']}**; "
                  f"whose training gain interval lies above 0: **{s['gain_above_0']} of {s['seeds']}**. "
                  f"Seeds whose held-out gain interval lies above 0: **{s['heldout_gain_above_0']} of "
                  f"{s['heldout_gain_known']}** with a held-out gain. Mean over seeds, 95% t interval (seeds as "
                  f"the unit): training gain **{_meanci_text(s, 'reward_gain')}**, held-out gain "
                  f"**{_meanci_text(s, 'heldout_gain')}**.", ""]
        if s["runs"] > s["seeds"]:
            lines += [f"{s['runs']} runs of {s['seeds']} seeds: a seed run more than once counts once, as the "
                      "mean of its runs.", ""]
        lines += paired_table(rows, s)
    return "\n".join(lines)


def paired_table(rows: Sequence[dict], s: dict) -> list[str]:
    """The training families played on the same seeds by the warm start and each seed's last policy
    (``outer.train_eval_episodes`` or ``scripts/policy_eval.py``): a row per evaluated seed and the mean; []
    when no seed was evaluated."""
    done = [r for r in rows if r.get("paired_train_gain") is not None]
    if not done:
        return []
    lines = ["Training families played on the same episode seeds by the warm start and the run's last policy "
             "(`outer.train_eval_episodes` or `scripts/policy_eval.py`; free of which families the steps drew):", "",
             "| seed | warm start | last policy | gain, paired [95% CI] | episodes a family |", "|---|---|---|---|---|"]
    for r in done:
        lines.append(f"| {r['seed']} | {_num(r['paired_train_start'])} | {_num(r['paired_train_end'])} | "
                     f"{ci_text(r['paired_train_gain'], r['paired_train_gain_lo'], r['paired_train_gain_hi'], True)} | "
                     f"{'-' if r.get('paired_train_episodes') is None else int(r['paired_train_episodes'])} |")
    lines += [f"| **mean ± sd ({s['paired_train_gain_known']} seeds)** | **{_pm(s, 'paired_train_start')}** | "
              f"**{_pm(s, 'paired_train_end')}** | **{_pm(s, 'paired_train_gain', True)}** | |", "",
              f"Seeds whose paired training gain interval lies above 0: **{s['paired_train_gain_above_0']} of "
              f"{s['paired_train_gain_known']}**. Mean over seeds, 95% t interval: "
              f"**{_meanci_text(s, 'paired_train_gain')}**.", ""]
    return lines


def write_seed_report(runs: Sequence[RunData], folder: str | Path) -> dict[str, Path]:
    """``seeds.md``, ``seeds.csv`` (full precision; per setting a row per seed, then ``mean`` and ``sd``) and
    ``seeds.png`` (``gains_plot``)
    into ``folder`` when the runs differ in ``seed``; returns their paths ({} otherwise, and an earlier
    comparison's seed report in ``folder`` is removed: it would mislead)."""
    folder = Path(folder)
    if not wanted(runs):
        for name in ("seeds.md", "seeds.csv", "seeds.png"):
            (folder / name).unlink(missing_ok=True)
        return {}
    folder.mkdir(parents=True, exist_ok=True)
    groups = []
    for name, members in settings(runs):
        rows = sorted((seed_row(r) for r in members), key=_seed_order)
        groups.append((name, rows, summary_row(rows)))
    md = folder / "seeds.md"
    md.write_text(markdown(groups))
    path = folder / "seeds.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for name, rows, s in groups:
            for r in rows:
                w.writerow({"setting": name, **{c: "" if r.get(c) is None else r[c] for c in CSV_COLUMNS[1:]}})
            for stat in ("mean", "sd"):
                w.writerow({"setting": name, "seed": stat,
                            **{k: "" if s[f"{k}_{stat}"] is None else s[f"{k}_{stat}"] for k in NUMBERS}})
    return {"seeds": md, "seeds_csv": path, "seeds_plot": gains_plot(groups, folder / "seeds.png")}


GAINS = (("reward_gain", "training gain (last 3 steps - first 3)"),
         ("heldout_gain", "held-out gain (end - start, paired)"),
         ("paired_train_gain", "training families, same seeds (paired)"))   # the last only when evaluated


def gains_plot(groups: Sequence[tuple[str, list[dict], dict]], path: Path) -> Path:
    """``seeds.png``: per gain (training, held-out) a panel with each seed's gain and its 95% interval, and the
    mean over the seeds with its t interval, one colour per setting side by side: whether an interval clears 0
    is read at a glance."""
    from agent_trainer.outer_loop.report.plots import pyplot, save_figure

    plt = pyplot()
    gains = [g for g in GAINS if g[0] != "paired_train_gain"
             or any(r.get(g[0]) is not None for _, rows, _ in groups for r in rows)]
    fig, axes = plt.subplots(1, len(gains), figsize=(5.5 * len(gains), 4))
    seeds = sorted({str(r["seed"]) for _, rows, _ in groups for r in rows},
                   key=lambda seed: _seed_order({"seed": seed}))
    ticks = [f"seed {x}" for x in seeds] + ["mean"]
    width = 0.7 / len(groups)
    for ax, (key, title) in zip(axes, gains):
        for i, (name, rows, s) in enumerate(groups):
            color, shift = f"C{i}", (i - (len(groups) - 1) / 2) * width
            points = [(seeds.index(str(r["seed"])), r[key], r.get(f"{key}_lo"), r.get(f"{key}_hi"))
                      for r in rows if r.get(key) is not None]
            if s.get(f"{key}_mean") is not None:
                points.append((len(seeds), s[f"{key}_mean"], s.get(f"{key}_mean_lo"), s.get(f"{key}_mean_hi")))
            for j, (x, y, lo, hi) in enumerate(points):
                err = [[y - lo], [hi - y]] if lo is not None and hi is not None else None
                mean = x == len(seeds)
                ax.errorbar(x + shift, y, yerr=err, fmt="s" if mean else "o", color=color, capsize=4,
                            markersize=8 if mean else 6, label=(name or "runs") if j == 0 else None)
        ax.axhline(0, color="grey", linewidth=1)
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set(title=title, ylabel="reward")
        ax.grid(alpha=0.3, axis="y")
        if len(groups) > 1:
            ax.legend(fontsize=8)
    return save_figure(fig, path)
