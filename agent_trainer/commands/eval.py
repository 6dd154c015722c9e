"""``at-eval``: the hidden score of a model on a task, next to the base model's cached baseline.

    at-eval model=tiny-s task=examples/tasks/calc_chain_v1_fast.json
    at-eval model=tiny-s checkpoint=runs/<run_id>/job/checkpoint     # a trained model vs its base
    at-eval table=true                                              # the whole baseline table
    at-eval model=smollm2-135m prompt_format=chat                   # through the model's chat template
    at-eval inner.eval_size=50 tracking=off

Writes ``eval.json`` into the run folder and logs the scores to MLflow (unless tracking=off).
Returns the hidden score, so Hydra sweepers can optimise it.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR
from agent_trainer.paths import resolve_path
from agent_trainer.tracking import check_reachable
from agent_trainer.commands._errors import user_errors


def run(cfg: DictConfig) -> float | None:
    """Score ``checkpoint`` (or the base model) on the task's hidden set; print score and baseline."""
    folder, conf = cli.open_run(cfg)
    if cfg.dry_run:
        return None
    check_reachable(cfg)  # a closed MLflow server fails here, in seconds
    if cfg.checkpoint and not cfg.table and not resolve_path(cfg.checkpoint).is_dir():  # before the heavy imports
        raise cli.UserError(
            f"checkpoint {cfg.checkpoint!r} is not a folder; give a trained model folder (config.json + safetensors)")
    from agent_trainer.evaluation import baselines
    from agent_trainer.evaluation.tasks import load_task
    from agent_trainer.inner_loop.models import resolve_model

    from agent_trainer.evaluation.prompts import for_task

    spec = load_task(resolve_path(cfg.task.spec_path))
    if cfg.prompt_format is not None:
        spec = spec.model_copy(update={"prompt_format": cfg.prompt_format})
    fmt = for_task(spec)
    n = conf.inner.eval_size or spec.hidden_eval_size
    if cfg.table:
        return _table(cfg, folder, n, fmt)

    from agent_trainer.evaluation.hidden_eval import score_checkpoint

    base = resolve_path(cfg.model.path) if cfg.model.path else resolve_model(cfg.model.name, cache_dir=cfg.cache_dir)
    target = resolve_path(cfg.checkpoint) if cfg.checkpoint else base
    # Started before scoring so a wrong tracking URI fails in seconds, not after the evaluation.
    with cli.tracker(cfg, "at-eval") as tr:
        tr.log_config(cfg)
        result = score_checkpoint(target, spec.family, n=n, batch_size=conf.inner.eval_batch_size,
                                  device=_device(conf.hardware.device.value), fmt=fmt)
        baseline = float(baselines.get_baseline(base, spec.family, n, cache_dir=cfg.cache_dir, fmt=fmt))
        summary = {
            "task": spec.name, "family": spec.family, "model": cfg.model.name, "checkpoint": str(target),
            "prompt_format": fmt.kind, "n": n, "hidden_score": float(result.score), "baseline": baseline,
            "uplift": float(result.score) - baseline,
        }
        (folder / "eval.json").write_text(json.dumps(summary, indent=2) + "\n")
        tr.log_metrics({"eval/hidden_score": summary["hidden_score"], "eval/baseline": baseline,
                        "eval/uplift": summary["uplift"]})
        tr.log_artifact(folder / "eval.json")
    cli.print_kv({k: f"{v:.4f}" if isinstance(v, float) else v for k, v in summary.items()})
    return summary["hidden_score"]


def _table(cfg: DictConfig, folder, n: int, fmt) -> None:
    """Baselines of every base model on disk (or ``table_models``) on every family, in format ``fmt`` (cached)."""
    from agent_trainer.evaluation.baselines import baseline_table
    from agent_trainer.inner_loop.models import BASE_MODELS, ModelNotFoundError, resolve_model

    models, missing = {}, []
    for name in list(cfg.table_models) or BASE_MODELS:
        try:
            models[name] = resolve_model(name, cache_dir=cfg.cache_dir, build_missing=False)
        except ModelNotFoundError:
            missing.append(name)
    if not models:
        raise cli.UserError("no base model is on disk yet; build the tiny ones with at-models")
    with cli.tracker(cfg, "at-eval", label="baselines", tags={"command": "at-eval table"}) as tr:
        table = baseline_table(models, n=n, cache_dir=cfg.cache_dir, kind=fmt.kind)
        text = f"hidden-eval baselines (n={n}, prompt format {fmt.kind}; untrained base models)\n{table.markdown}"
        if missing:
            text += f"\nnot on disk (skipped): {', '.join(missing)}"
        (folder / "baselines.md").write_text(text + "\n")
        tr.log_metrics({f"baseline/{m}/{f}": s for m, per in table.scores.items() for f, s in per.items()})
        tr.log_artifact(folder / "baselines.md")
    print(text)


def _device(wanted: str) -> str:
    if wanted != "auto":
        return wanted
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@hydra.main(config_path=str(CONFIG_DIR), config_name="eval", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    return cli.call(run, cfg, user_errors=user_errors, value_name="eval/hidden_score")


def main() -> None:
    cli.main(_hydra_main, "eval")


if __name__ == "__main__":
    main()
