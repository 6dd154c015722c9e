"""The hidden set's salt: public by default (today's sets), a named public salt, or a per-installation secret.

The secret (``<cache>/hidden_salt.secret``, 0600, made on first use) decides which items of the public
hidden pool form the hidden set: the public generator alone does not rebuild it. Baselines are cached
per salt; the contamination check and the scorer follow the same salt; no sandbox mounts the secret.
"""

from __future__ import annotations

import os
import stat

import pytest

from agent_trainer.evaluation import baselines
from agent_trainer.evaluation.contamination import find_overlap
from agent_trainer.evaluation.families import FAMILIES, HIDDEN_SEED_BASE, get_family
from agent_trainer.evaluation.hidden_eval import hidden_set
from agent_trainer.salt import SALT_ENV, SECRET_FILE, SaltError, hidden_salt

N = 200


def _prompts(items):
    return {e.prompt for e in items}


@pytest.fixture
def installation(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_TRAINER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(SALT_ENV, raising=False)
    return tmp_path / "cache"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_default_salt_is_the_public_generator_and_a_secret_one_is_not(family, installation):
    fam = get_family(family)
    public = fam._draw(HIDDEN_SEED_BASE + fam.version, N, hidden=True)  # what anyone can run from the repository
    assert hidden_set(family, N) == public == hidden_set(family, N, "public")
    secret = hidden_set(family, N, "secret")
    assert (installation / SECRET_FILE).is_file() and hidden_set(family, N, "secret") == secret
    guesses = [public, hidden_set(family, N, "public:paper"), *(fam._draw(s, N, hidden=True) for s in range(3))]
    for guess in guesses:  # the public generator with any public seed or salt: chance overlap only
        assert len(_prompts(guess) & _prompts(secret)) < 0.6 * N, family
    assert _prompts(secret).isdisjoint(_prompts(fam.training_examples(seed=0, n=2000)))  # still the hidden pool


def test_the_secret_is_private_per_installation_and_checked(installation, tmp_path, monkeypatch):
    first = hidden_salt("secret")
    path = installation / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and first.value not in first.label + first.setting
    assert hidden_salt("secret") == first and first.label.startswith("secret:")
    monkeypatch.setenv("AGENT_TRAINER_CACHE", str(tmp_path / "other"))
    other = hidden_salt("secret")
    assert other.value != first.value and hidden_set("calc_chain", N, "secret") != hidden_set("calc_chain", N,
                                                                                             first.setting)
    os.chmod(path, 0o644)
    with pytest.raises(SaltError, match="chmod 600"):
        hidden_salt(first.setting)
    with pytest.raises(SaltError, match="public, public:NAME, secret"):
        hidden_salt("pepper")


def test_baselines_and_the_contamination_check_follow_the_salt(installation, monkeypatch):
    monkeypatch.setattr(baselines, "checkpoint_hash", lambda path: "model-sha")
    public_key = baselines._key("m", "calc_chain", N)
    # A family split by the prompt hash keeps the keys it always had; a grouped split (calc_chain) has its own.
    version = get_family("reverse_text").version
    assert baselines._key("m", "reverse_text", N) == f"model-sha/reverse_text/v{version}/n{N}"
    assert public_key == f"model-sha/calc_chain/v{get_family('calc_chain').version}/n{N}/split-grouped"
    monkeypatch.setenv(SALT_ENV, "secret")
    secret_key = baselines._key("m", "calc_chain", N)
    assert secret_key.startswith(public_key + "/salt-secret:") and secret_key != public_key
    secret_items = hidden_set("calc_chain", N)
    only_public = next(e for e in hidden_set("calc_chain", N, "public") if e.prompt not in _prompts(secret_items))
    assert find_overlap("calc_chain", N, [("row", secret_items[0].prompt)]).flagged
    assert not find_overlap("calc_chain", N, [("row", only_public.prompt)]).flagged


def test_no_sandbox_mounts_the_secret(installation, tmp_path):
    from agent_trainer.inner_loop.isolation.sandbox import SandboxPolicy, reward_host_argv, trainer_wrapper

    hidden_salt("secret")
    folders = {name: tmp_path / name for name in ("job", "out", "model")}
    for folder in folders.values():
        folder.mkdir()
    wrap = trainer_wrapper(SandboxPolicy(), job_dir=folders["job"], output_dir=folders["out"],
                           model_dir=folders["model"], deadline_s=60)
    argv = [*wrap(["python"]), *reward_host_argv(SandboxPolicy(), job_dir=folders["job"], fd=3, deadline_s=60,
                                                 sandboxed=True, info_fd=None)]
    assert not any(str(installation) in str(a) for a in argv), [a for a in argv if str(installation) in str(a)]


def test_a_run_takes_the_salt_as_a_setting_and_refuses_a_bad_one(installation, tmp_path):
    from hydra import compose, initialize_config_dir

    from agent_trainer.cli import export_registries
    from agent_trainer.config import ConfigError, validate
    from agent_trainer.paths import PROJECT_ROOT

    with initialize_config_dir(str(PROJECT_ROOT / "configs"), version_base="1.3"):
        default = validate(compose("config", overrides=[f"runs_dir={tmp_path}"]))
        named = validate(compose("config", overrides=[f"runs_dir={tmp_path}", "task.hidden_salt=public:paper-1"]))
        secret = validate(compose("config", overrides=[f"runs_dir={tmp_path}", "task.hidden_salt=secret"]))
        with pytest.raises(ConfigError, match="task.hidden_salt: .*public, public:NAME, secret"):
            validate(compose("config", overrides=[f"runs_dir={tmp_path}", "task.hidden_salt=paper-1"]))
    assert default.task.hidden_salt == "public"
    try:
        export_registries(named)  # what every command does at start: its jobs, scorer and checks read the variable
        assert hidden_salt().label == "public:paper-1"
        assert hidden_set("calc_chain", N) == hidden_set("calc_chain", N, "public:paper-1") != hidden_set(
            "calc_chain", N, "public")
        export_registries(secret)  # the file's path goes to the environment, never the secret
        assert os.environ[SALT_ENV] == f"secret:{(installation / SECRET_FILE).resolve()}"
        assert hidden_salt().value not in os.environ[SALT_ENV]
    finally:
        os.environ.pop(SALT_ENV, None)
