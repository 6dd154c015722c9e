"""PNG plots of an outer training run, from its per-step metrics (``metrics.jsonl``).

    >>> write_training_plots(rows, run_dir / "plots")   # reward.png, choices.png, heldout.png
"""

from __future__ import annotations

from pathlib import Path

STAGES = (("validation_mean", "validation"), ("job_success_rate", "job success"), ("quality_mean", "quality"),
          ("speed_mean", "speed"))


def pyplot():
    """matplotlib's pyplot on the Agg backend (PNG files, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out, write the PNG and free the figure."""
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")   # a legend placed outside the axes stays in the file
    plt.close(fig)
    return path


def reward_plot(rows: list[dict], path: Path) -> Path:
    """Mean episode reward (with +-1 std) and each stage per step."""
    plt = pyplot()
    steps = [r["step"] for r in rows]
    mean = [r["reward_mean"] for r in rows]
    std = [r.get("reward_std", 0.0) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(steps, mean, marker="o", label="reward (mean)")
    ax1.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax1.set(xlabel="outer step", ylabel="episode reward", title="Episode reward")
    ax1.grid(alpha=0.3)
    ax1.legend()
    for key, label in STAGES:
        if any(key in r for r in rows):
            ax2.plot(steps, [r.get(key, 0.0) for r in rows], marker=".", label=label)
    ax2.set(xlabel="outer step", ylabel="stage value", title="Reward stages")
    ax2.grid(alpha=0.3)
    ax2.legend()
    return save_figure(fig, path)


def choices_plot(rows: list[dict], path: Path) -> Path:
    """Share of each base model, algorithm and adapter choice per step."""
    plt = pyplot()
    steps = [r["step"] for r in rows]
    keys = sorted({k for r in rows for k in r if k.startswith("share_")})
    fig, ax = plt.subplots(figsize=(8, 4))
    for k in keys:
        ax.plot(steps, [r.get(k, 0.0) for r in rows], marker=".", label=k.removeprefix("share_"))
    ax.set(xlabel="outer step", ylabel="share of episodes", title="Agent choices", ylim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    if keys:
        ax.legend(fontsize=8, ncol=2)
    return save_figure(fig, path)


def heldout_points(rows: list[dict], prefixes: tuple[str, str] = ("heldout_", "heldout_end_"),
                   ) -> list[tuple[int, float, float | None, float | None]]:
    """``(x, mean, lo, hi)`` of every evaluation under ``prefixes`` (held-out by default; ``("train_eval_",
    "train_eval_end_")``: the training families on fixed seeds): a row's own at its step (before its update),
    its end evaluation at the next step (after the update); lo/hi None where a row has no interval."""
    out = []
    for r in rows:
        for prefix, x in ((prefixes[0], r["step"]), (prefixes[1], r["step"] + 1)):
            if f"{prefix}reward_mean" in r:
                out.append((x, r[f"{prefix}reward_mean"], r.get(f"{prefix}reward_lo"), r.get(f"{prefix}reward_hi")))
    return out


def heldout_plot(rows: list[dict], path: Path) -> Path:
    """Held-out reward at each evaluation, with its bootstrap 95% interval, next to the training reward (and the
    training families on fixed seeds at the start and end, when the run played them: ``outer.train_eval_episodes``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rows], [r["reward_mean"] for r in rows], marker=".", label="training families")
    shown = []
    for prefixes, name, marker in ((("heldout_", "heldout_end_"), "held-out families", "s"),
                                   (("train_eval_", "train_eval_end_"), "training families, fixed seeds", "D")):
        pts = heldout_points(rows, prefixes)
        if not pts:
            continue
        shown.append(name.split(",")[0])
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [[y - (lo if lo is not None else y) for _, y, lo, _ in pts],
               [(hi if hi is not None else y) - y for _, y, _, hi in pts]]
        keys = tuple(p + "rewards" for p in prefixes)
        n = next((len(r[k]) for r in rows for k in keys if r.get(k)), None)
        ax.errorbar(xs, ys, yerr=err, marker=marker, capsize=4,
                    label=name + (f" ({n} episodes, 95% CI)" if n else ""))
    ax.set(xlabel="outer step (evaluations: policy after that many updates)", ylabel="episode reward",
           title="Held-out families" if shown in ([], ["held-out families"])
           else " and ".join(shown).capitalize() + " on fixed seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def write_training_plots(rows: list[dict], folder: str | Path) -> list[Path]:
    """All training plots into ``folder``; returns their paths (none when there are no rows)."""
    if not rows:
        return []
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return [reward_plot(rows, out / "reward.png"), choices_plot(rows, out / "choices.png"),
            heldout_plot(rows, out / "heldout.png")]
