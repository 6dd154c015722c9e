"""Rewards library on hand-made completions, and loading of agent reward files."""

from __future__ import annotations

import pytest

from agent_trainer.inner_loop.spec.jobspec import RewardSpec
from agent_trainer.inner_loop.train.rewards import (
    LIBRARY,
    MAX_ABS_REWARD,
    RewardError,
    checked,
    describe_library,
    exact_match,
    format_ok,
    label_match,
    length_penalty,
    numeric_closeness,
    resolve_rewards,
    task_score,
    token_overlap,
)


def call(fn, completions, answers, **kwargs):
    return fn(prompts=["p"] * len(completions), completions=completions, answer=answers, **kwargs)


def test_exact_match_normalises_and_uses_first_line():
    got = call(exact_match, ["16", " 16 \njunk", "15", "Tac", ""], ["16", "16", "16", "tac", "16"])
    assert got == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_numeric_closeness_gives_partial_credit():
    got = call(numeric_closeness, ["16", "17", "14", "x", "-6", "2900 m"], ["16", "16", "16", "16", "-6", "3000"])
    assert got[0] == 1.0 and got[4] == 1.0
    assert got[1] == pytest.approx(1 / (1 + 1 / 1.6))  # s = max(1, 16/10)
    assert got[1] > got[2] > got[3] == 0.0
    assert got[5] == pytest.approx(1 / (1 + 100 / 300))  # large answers keep credit for a near miss


def test_numeric_closeness_does_not_apply_to_words():
    assert call(numeric_closeness, ["billing", "3"], ["billing", None]) == [None, None]


def test_format_ok_checks_shape_of_answer():
    got = call(format_ok, ["16", "16 apples", "", "2 5 9", "2,5,9", "tac", "tac1", "16\n17"],
               ["-3", "-3", "-3", "1 2 3", "1 2 3", "cat", "cat", "16"])
    assert got == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_length_penalty_is_zero_when_short_and_capped_at_minus_one():
    got = call(length_penalty, ["16", "16 and", "x" * 500, " 16 \n"], ["16", "16", "16", "16"])
    assert got == [0.0, pytest.approx(-3 / 16), -1.0, 0.0]
    assert call(length_penalty, ["a" * 16, "a" * 30], None) == [0.0, pytest.approx(-14 / 16)]


def test_label_match_first_word_case_insensitive():
    assert call(label_match, ["Billing.", "billing please", "technical", ""], ["billing"] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_token_overlap_rewards_partial_sequences():
    got = call(token_overlap, ["2 5 9", "5 2 9", "2 5", "7 8 1", "tac", "tca", ""],
               ["2 5 9", "2 5 9", "2 5 9", "2 5 9", "tac", "tac", "tac"])
    assert got[0] == 1.0 and got[4] == 1.0
    assert got[1] == pytest.approx((1 / 3 + 1) / 2)  # right numbers, one in place
    assert got[2] == pytest.approx((2 / 3 + 0.8) / 2)
    assert got[3] == 0.0 and got[6] == 0.0
    assert got[5] == pytest.approx((1 / 3 + 1) / 2)


def test_task_score_uses_the_family_scorer_and_skips_unknown_families():
    got = call(task_score, ["16", "16.0", "billing", "16"], ["16", "16", "billing", "16"],
               family=["calc_chain", "calc_chain", "triage", None])
    assert got == [1.0, 1.0, 1.0, None]


def test_missing_answer_column_means_not_applicable():
    for name in ("exact_match", "numeric_closeness", "label_match", "token_overlap", "task_score"):
        assert call(LIBRARY[name].fn, ["1", "2"], None) == [None, None], name


def test_column_of_wrong_length_is_an_error():
    with pytest.raises(RewardError, match="2 values for 3 completions"):
        call(exact_match, ["1", "2", "3"], ["1", "2"])


def test_trl_extra_kwargs_are_accepted():
    got = exact_match(prompts=["a"], completions=["1"], answer=["1"], completion_ids=[[5]], trainer_state=None,
                      log_extra=print, log_metric=print, family=["calc_chain"])
    assert got == [1.0]


def test_library_has_descriptions_for_the_agent():
    listed = describe_library()
    assert {d["name"] for d in listed} == set(LIBRARY)
    assert all(len(d["description"]) > 20 for d in listed)


def test_resolve_library_and_file_rewards(tmp_path):
    (tmp_path / "reward.py").write_text(
        "def brevity(prompts, completions, **kwargs):\n    return [1.0 / (1 + len(c)) for c in completions]\n")
    spec = RewardSpec.model_validate({"functions": [{"name": "exact_match", "weight": 2},
                                                     {"name": "brevity", "source": "file", "weight": 0.5}]})
    funcs = resolve_rewards(spec, tmp_path)
    assert [(n, w) for n, _, w in funcs] == [("exact_match", 2.0), ("brevity", 0.5)]
    assert [f.__name__ for _, f, _ in funcs] == ["exact_match", "brevity"]  # TRL logs by __name__
    assert funcs[1][1](prompts=["p", "p"], completions=["", "abc"], answer=["1", "2"]) == [1.0, 0.25]


@pytest.mark.parametrize("source, match", [
    ("def other(prompts, completions, **kw):\n    return []\n", "defines no function 'mine'"),
    ("def mine(prompts, completions:\n", "syntax error"),
    ("import not_a_real_module_xyz\n", "failed on import: ModuleNotFoundError"),
])
def test_bad_reward_files_raise_reward_error(tmp_path, source, match):
    (tmp_path / "reward.py").write_text(source)
    spec = RewardSpec.model_validate({"functions": [{"name": "mine", "source": "file"}]})
    with pytest.raises(RewardError, match=match):
        resolve_rewards(spec, tmp_path)


@pytest.mark.parametrize("body, match", [
    ("return [1.0]", "returned 1 values for 2 completions"),
    ("return 1.0", "returned float"),
    ("return ['high', 0.0]", "returned 'high'"),
    ("return [float('nan'), 0.0]", "finite float"),
])
def test_bad_reward_results_are_reported_by_name(tmp_path, body, match):
    (tmp_path / "reward.py").write_text(f"def mine(prompts, completions, **kw):\n    {body}\n")
    spec = RewardSpec.model_validate({"functions": [{"name": "mine", "source": "file"}]})
    (_, fn, _), = resolve_rewards(spec, tmp_path)
    with pytest.raises(RewardError, match=match):
        fn(prompts=["p", "p"], completions=["a", "b"])


class _Liar(float):
    """A float that tells math.isfinite 0.5 and float() 1e308."""

    def __float__(self):
        return 1e308


@pytest.mark.parametrize("value", [_Liar(0.5), float("inf"), float("nan"), 1e5, -1e300, True, "1.0", [1.0]])
def test_reward_values_must_be_plain_finite_bounded_floats(value):
    fn = checked("r", lambda prompts, completions, **kw: [value] * len(completions))
    with pytest.raises(RewardError, match="finite float or None"):
        fn(prompts=["p"], completions=["c"])


def test_plain_numbers_pass_as_floats():
    import numpy as np

    fn = checked("r", lambda prompts, completions, **kw: [1, 0.5, None, np.float64(-2.0), MAX_ABS_REWARD])
    assert fn(prompts=["p"] * 5, completions=["c"] * 5) == [1.0, 0.5, None, -2.0, MAX_ABS_REWARD]
    assert all(type(v) is float for v in fn(prompts=["p"] * 5, completions=["c"] * 5) if v is not None)


@pytest.mark.parametrize("logs", [{"reward": float("inf")}, {"rewards/mine/mean": float("nan")},
                                  {"reward_std": float("-inf")}, {"loss": float("nan")}])
def test_a_non_finite_reward_or_loss_ends_the_run_as_diverged(logs):
    from types import SimpleNamespace

    from agent_trainer.inner_loop.train.callbacks import BudgetGuard

    guard = BudgetGuard(10, 60.0)
    control = SimpleNamespace(should_training_stop=False)
    guard.on_log(None, SimpleNamespace(global_step=3), control, logs={"reward": 0.5, **logs})
    assert guard.stop_reason == "diverged" and control.should_training_stop, guard.detail
    ok = BudgetGuard(10, 60.0)
    ok.on_log(None, SimpleNamespace(global_step=3), SimpleNamespace(should_training_stop=False),
              logs={"reward": 0.5, "loss": 0.1, "rewards/mine/mean": 0.2, "completions/mean_length": 3.0})
    assert ok.stop_reason is None
