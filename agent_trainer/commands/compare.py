"""``at-compare``: tables and PNG plots of runs, read from MLflow (reward curves, stage rates, switch
rates, suggestion adoption, cost per unit of reward).

    at-compare runs=[<run id>,<run id>]            # MLflow run ids (a fork's parent brings its branches)
    at-compare runs=[runs/<sweep id>]              # a sweep folder: each numbered run sub-folder (+ seeds.md)
    at-compare runs=[<sweep id>/0,<run id>]        # run folders (or run_ids in runs_dir), mixed
    at-compare experiments=[agent-trainer]         # every top-level run of an experiment
    at-compare runs=[...] group_by=[agent.model]   # one table row per model instead of per differing setting
    at-compare mode=people runs=[<run folder>,...] people.episodes=4   # agents against people, one table

Writes ``runs/<run_id>/`` (or ``out=``); logs nothing. The files: docs/sweeps.md, "Compare"; ``mode=people``:
docs/evaluation.md, "Agents against people" (``agent_trainer.outer_loop.report.people``).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR
from agent_trainer.paths import resolve_path


def run(cfg: DictConfig) -> dict | None:
    """Write the comparison; returns the paths written."""
    from agent_trainer.outer_loop.report.compare import CompareError, collect, group_keys, run_rows, write_report
    from agent_trainer.outer_loop.report.compare_runs import machine_notes
    from agent_trainer.outer_loop.report.seed_report import write_seed_report

    if cfg.mode == "people":
        return people(cfg)
    if not cfg.runs and not cfg.experiments:
        raise cli.UserError("give what to compare: runs=[<MLflow run id | run folder | sweep folder>,...] "
                            "or experiments=[<experiment name>]")
    folder = cli.start_run(cfg)
    if cfg.dry_run:
        return None

    def note(line: str) -> None:
        print(f"at-compare: {line}", flush=True)

    try:
        runs = collect(cfg.tracking.tracking_uri, list(cfg.runs), list(cfg.experiments),
                       runs_dir=resolve_path(cfg.runs_dir), note=note,
                       connect_timeout_s=cfg.tracking.connect_timeout_s)
    except CompareError as e:
        raise cli.UserError(str(e)) from None
    keys = group_keys(runs, list(cfg.group_by))
    rows = run_rows(runs, keys)
    out = resolve_path(cfg.out) if cfg.out else folder
    paths = write_report(runs, rows, out, note=note)
    paths.update(write_seed_report(runs, out))
    machines = machine_notes(runs)
    if machines:
        # Beside the tables: a difference between these runs is partly the machines'.
        paths["machines"] = out / "machines.md"
        paths["machines"].write_text("The runs ran on different machines or software:\n\n"
                                     + "".join(f"- {line}\n" for line in machines))
    else:
        (out / "machines.md").unlink(missing_ok=True)   # an earlier comparison's, in the same folder, would mislead
    print(paths["table"].read_text())
    print(paths["configs"].read_text())
    if "seeds" in paths:
        print(paths["seeds"].read_text())
    for line in machines:
        note(line)
    print(f"at-compare: {len(rows)} runs by {', '.join(keys)} -> {paths['table'].parent}")
    return paths


def people(cfg: DictConfig) -> dict | None:
    """Agents against people: the rows of ``cfg.people`` played on the runs' tasks; returns the paths written."""
    from omegaconf import OmegaConf

    from agent_trainer.outer_loop.report.compare_runs import CompareError, resolve
    from agent_trainer.outer_loop.report.people import people_table, write_table
    from agent_trainer.outer_loop.rl.run_config import quiet_libraries

    p = cfg.people
    try:
        refs = resolve(list(cfg.runs), cfg.tracking.tracking_uri, resolve_path(cfg.runs_dir),
                       note=lambda line: print(f"at-compare: {line}", flush=True))
    except CompareError as e:
        raise cli.UserError(str(e)) from None
    ids = [r.run_id for r in refs if r.folder is None]
    if ids or not refs:
        raise cli.UserError("mode=people plays the runs' policies again: give their run folders (or sweep folders)"
                            + (f", not MLflow run ids ({', '.join(map(str, ids))})" if ids else ": runs=[...]"))
    folders = [r.folder for r in refs]
    folder = cli.start_run(cfg)
    if cfg.dry_run:
        return None
    quiet_libraries()
    out = resolve_path(cfg.out) if cfg.out else folder
    table = people_table(folders, out, rows=list(p.rows), families=",".join(p.families), episodes=p.episodes,
                         jobs=OmegaConf.to_container(p.jobs), candidates=list(p.candidates),
                         note=lambda line: print(f"at-compare: {line}", flush=True))
    paths = write_table(table, out)
    print(paths["table"].read_text())
    print(f"at-compare: {len(table['rows'])} rows -> {out} (people.md, .csv, .json, .png)")
    return paths


@hydra.main(config_path=str(CONFIG_DIR), config_name="compare", version_base="1.3")
def _hydra_main(cfg: DictConfig):
    return cli.call(run, cfg)


def main() -> None:
    cli.main(_hydra_main, "compare")


if __name__ == "__main__":
    main()
