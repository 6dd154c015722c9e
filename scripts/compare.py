"""``at-compare``: tables and PNG plots of MLflow runs (reward curves, stage rates, switch rates,
suggestion adoption, cost per unit of reward).

    at-compare runs=[<run id>,<run id>]          # MLflow run ids (a fork's parent brings its branches)
    at-compare experiments=[agent-trainer]       # every top-level run of an experiment

Writes ``runs/<run_id>/`` (or ``out=``): ``compare.md`` / ``compare.csv`` (one row per run),
``configs.md`` / ``configs.csv`` (one row per agent configuration, ``group_by`` params),
``reward_curves.png``, ``stages.png``, ``switches.png``, ``adoption.png``, ``cost.png`` and
``plot_data.json`` (the numbers drawn). Reads MLflow at ``tracking.tracking_uri``; logs nothing.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR
from agent_trainer.paths import resolve_path


def run(cfg: DictConfig) -> dict | None:
    """Write the comparison; returns the paths written."""
    from outer_loop.compare import CompareError, collect, run_rows, write_report

    if not cfg.runs and not cfg.experiments:
        raise cli.UserError("give what to compare: runs=[<run id>,<run id>] or experiments=[<experiment name>]")
    folder = cli.start_run(cfg)
    if cfg.dry_run:
        return None
    try:
        runs = collect(str(cfg.tracking.tracking_uri), list(cfg.runs), list(cfg.experiments))
    except CompareError as e:
        raise cli.UserError(str(e)) from None
    rows = run_rows(runs, list(cfg.group_by))
    paths = write_report(runs, rows, resolve_path(cfg.out) if cfg.out else folder)
    print(paths["table"].read_text())
    print(paths["configs"].read_text())
    print(f"at-compare: {len(rows)} runs -> {paths['table'].parent}")
    return paths


@hydra.main(config_path=str(CONFIG_DIR), config_name="compare", version_base="1.3")
def _hydra_main(cfg: DictConfig):
    return cli.call(run, cfg)


def main() -> None:
    cli.main(_hydra_main, "compare")


if __name__ == "__main__":
    main()
