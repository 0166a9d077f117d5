"""A reward function that raises, returns the wrong number of values or NaN stops `ditty run` with
exit code 2 and a message naming the function and the prompt; the last checkpoint stays intact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ditty.checkpoint.integrity import checkpoint_problems
from ditty.cli import main
from ditty.config.writer import recipe_to_toml
from tests.rl import rewards_for_tests
from tests.rl.helpers import grpo_config, with_rl


def run(tmp_path, capsys, reward: str, **train):
    config = with_rl(grpo_config(tmp_path, train=dict(steps=4, **train), checkpoint=dict(every=2)), rewards=[reward])
    return run_config(tmp_path, capsys, config)


def run_config(tmp_path, capsys, config):
    """`ditty run` of `config` written as a recipe, in-process: its exit code and what it printed."""
    path = tmp_path / "grpo.toml"
    path.write_text(recipe_to_toml(config))
    code = main(["run", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(
    "reward, words",
    [
        ("tests.rl.rewards_for_tests:raises", "raised RuntimeError: the answer checker crashed"),
        pytest.param(
            "tests.rl.rewards_for_tests:wrong_count", "returned 7 values for 8 completions", marks=pytest.mark.slow
        ),
        pytest.param("tests.rl.rewards_for_tests:nan_reward", "returned nan for a completion", marks=pytest.mark.slow),
    ],
)
def test_a_failing_reward_function_is_exit_2_naming_it_and_the_prompt(tmp_path, capsys, reward, words):
    code, out = run(tmp_path, capsys, reward)
    assert code == 2, out
    assert f"reward function {reward} {words}" in out, out
    assert "(prompt '" in out and "+" in out  # an addition prompt such as '12+47='
    assert "Traceback" not in out


def test_the_last_checkpoint_stays_intact_when_a_reward_function_fails(tmp_path, capsys):
    rewards_for_tests.CALLS["count"] = 0
    rewards_for_tests.FAIL_FROM_CALL["value"] = 3  # steps 1 and 2 score, step 3 raises
    code, out = run(tmp_path, capsys, "tests.rl.rewards_for_tests:fails_later")
    assert code == 2, out
    assert "fails_later raised ZeroDivisionError" in out
    checkpoints = Path(tmp_path / "run" / "checkpoints")
    saved = sorted(name for name in os.listdir(checkpoints) if name.startswith("step-"))
    assert saved == ["step-2"], saved
    assert checkpoint_problems(checkpoints / "step-2") == []
    assert not (tmp_path / "run" / "final").exists()


def test_a_reward_function_that_calls_sys_exit_is_exit_2_naming_it(tmp_path, capsys):
    code, out = run(tmp_path, capsys, "tests.rl.rewards_for_tests:exits_three")
    assert code == 2, out  # not 3, outside ditty's codes, nor 0 with no final/
    assert "reward function tests.rl.rewards_for_tests:exits_three called sys.exit(3)" in out, out
    assert "Traceback" not in out and not (tmp_path / "run" / "final").exists()


def test_rewards_whose_weighted_sum_overflows_stop_the_run(tmp_path, capsys):
    # Two rewards of 1e308 each: finite alone, inf summed (the run used to end at exit 0 with val_reward inf).
    huge = "tests.rl.rewards_for_tests:huge"
    config = with_rl(grpo_config(tmp_path, train=dict(steps=2)), rewards=[huge, huge])
    code, out = run_config(tmp_path, capsys, config)
    assert code == 2, out
    assert f"the weighted sum of {huge}, {huge} is inf for a completion" in out, out
    assert not (tmp_path / "run" / "final").exists()


def test_rewards_too_large_to_normalise_stop_the_run_naming_them(tmp_path, capsys):
    """One reward of 1e308 a completion: finite, but its group's mean overflows; the run used to train
    on NaN advantages until it stopped as 'diverging'."""
    config = with_rl(grpo_config(tmp_path, train=dict(steps=2)), rewards=["tests.rl.rewards_for_tests:huge"])
    code, out = run_config(tmp_path, capsys, config)
    assert code == 2, out
    assert "`rl.rewards` the rewards (up to 1e+308 in magnitude) are too large to normalise" in out, out
    assert "diverging" not in out and not (tmp_path / "run" / "final").exists()


def test_a_data_column_named_as_a_reward_argument_is_exit_2(tmp_path, capsys):
    import json

    rows = tmp_path / "prompts.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completions": str(i + 1)}) + "\n" for i in range(16)))
    config = grpo_config(tmp_path, train=dict(steps=1))
    from dataclasses import replace

    config = replace(config, data=replace(config.data, source="file", path=str(rows), name=None, num_samples=None))
    code, out = run_config(tmp_path, capsys, config)
    assert code == 2, out
    assert "`data` the prompt rows have a column 'completions'" in out and "Traceback" not in out, out


def test_a_reward_function_that_never_returns_stops_at_the_timeout_with_the_checkpoint_intact(tmp_path, capsys):
    rewards_for_tests.CALLS["count"] = 0
    rewards_for_tests.FAIL_FROM_CALL["value"] = 3  # steps 1 and 2 score, step 3 hangs
    config = with_rl(
        grpo_config(tmp_path, train=dict(steps=4), checkpoint=dict(every=2)),
        rewards=["tests.rl.rewards_for_tests:hangs_later"],
        reward_timeout_s=1.0,
    )
    code, out = run_config(tmp_path, capsys, config)
    assert code == 2, out
    assert "hangs_later did not return within rl.reward_timeout_s = 1 s" in out, out
    checkpoints = Path(tmp_path / "run" / "checkpoints")
    assert sorted(n for n in os.listdir(checkpoints) if n.startswith("step-")) == ["step-2"]
    assert checkpoint_problems(checkpoints / "step-2") == []
    assert not (tmp_path / "run" / "final").exists()
