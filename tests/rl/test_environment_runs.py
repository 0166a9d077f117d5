"""`[rl] environment` and `tools` through `ditty check` and `ditty run`, in-process: bad input is exit
code 2 naming the key (before weights load), an environment whose step raises stops the run with exit
code 2 naming it and the row (the last checkpoint intact), and a one-turn environment written against
the reset/step protocol trains tiny_grpo exactly as today's reward function does."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from ditty.checkpoint.integrity import checkpoint_problems
from ditty.cli import main
from ditty.config.writer import recipe_to_toml
from tests.rl.helpers import grpo_config, with_rl
from tests.rl.test_rl_recipe import check

ENVS = "tests.rl.environments_for_tests"


@pytest.mark.parametrize(
    "flags, key, words",
    [
        (["--rl.environment", "no_such_module:Game"], "rl.environment", "cannot import module 'no_such_module'"),
        (["--rl.environment", f"{ENVS}:NoSuchGame"], "rl.environment", "has no attribute 'NoSuchGame'"),
        (["--rl.environment", f"{ENVS}:NOT_A_CLASS"], "rl.environment", "is not a class"),
        (["--rl.environment", f"{ENVS}:echo"], "rl.environment", "is not a class"),
        (["--rl.environment", f"{ENVS}:NeedsALevel"], "rl.environment", "cannot be built without arguments"),
        (
            ["--rl.environment", f"{ENVS}:WrappedOriginalNeedingALevel"],
            "rl.environment",
            "cannot be built without arguments",
        ),
        (
            ["--rl.environment", f"{ENVS}:NeedsALevel", "--rl.environment_args", "{ levl = 2 }"],
            "rl.environment_args",
            "takes no argument 'levl' (its constructor takes level)",
        ),
        (
            ["--rl.environment", f"{ENVS}:NeedsALevel", "--rl.environment_args", "{ seed = 2 }"],
            "rl.environment_args",
            "(it needs level)",
        ),
        (
            ["--rl.environment", f"{ENVS}:WrappedOriginalNeedingALevel", "--rl.environment_args", "{ lvl = 1 }"],
            "rl.environment_args",
            "takes no argument 'lvl'",
        ),
        (["--rl.environment_args", "{ level = 2 }"], "rl.environment_args", "none is named"),
        (["--rl.tools", '["calculator"]'], "rl.tools[0]", 'not of the form "package.module:Name"'),
        (
            ["--rl.tools", '["ditty.objectives.environments.tools.builtin_tools:abacus"]'],
            "rl.tools[0]",
            "no attribute 'abacus'",
        ),
        (["--rl.tools", f'["{ENVS}:echo", "{ENVS}:echo"]'], "rl.tools[1]", "a second tool named 'echo'"),
        (["--rl.tools", f'["{ENVS}:fetch"]'], "rl.tools[0]", "fetch is async (async def)"),
        (["--rl.tools", f'["{ENVS}:echo"]', "--rl.tools_isolation", "fork"], "rl.tools_isolation", "fork"),
        (["--rl.tools", f'["{ENVS}:echo"]', "--rl.max_turns", "0"], "rl.max_turns", "at least 1"),
        (["--rl.tools", f'["{ENVS}:echo"]', "--rl.tool_timeout_s", "0"], "rl.tool_timeout_s", "above 0"),
        (
            ["--rl.environment", f"{ENVS}:CountingTurns", "--rl.environment_timeout_s", "-1"],
            "rl.environment_timeout_s",
            "0 (no limit) or more",
        ),
        (
            ["--rl.tools", f'["{ENVS}:echo"]', "--rollout.backend", "vllm-server"],
            "rollout.backend",
            "the generate or the vllm",
        ),
        (
            ["--rl.tools", f'["{ENVS}:echo"]', "--rollout.sampler_correction", "tis"],
            "rollout.sampler_correction",
            "reports no log-probabilities",  # generate's episodes; vllm's carry the engine's
        ),
    ],
)
def test_bad_environment_input_is_exit_2_naming_the_key(tmp_path, capsys, flags, key, words):
    code, out = check(tmp_path, capsys, *flags)
    assert code == 2, out
    assert f"`{key}`" in out and words in out, out
    assert "Traceback" not in out


def test_a_list_entry_set_by_a_flag_is_attributed_to_the_flag(tmp_path, capsys):
    code, out = check(tmp_path, capsys, "--rl.tools", f'["{ENVS}:echo", "{ENVS}:NOT_A_CLASS"]')
    assert code == 2 and "`rl.tools[1]`" in out and "is a int, not a function (set by --rl.tools)" in out, out


def test_a_malformed_tools_list_is_exit_2(tmp_path, capsys):
    code, out = check(tmp_path, capsys, "--rl.tools", '"ditty.objectives.environments.tools.builtin_tools:calculator"')
    assert code == 2 and "rl.tools" in out and "Traceback" not in out, out


def test_settings_only_episodes_read_warn_without_them(tmp_path, capsys):
    code, out = check(tmp_path, capsys, "--rl.max_turns", "3")
    assert code == 0 and "`rl.max_turns`" in out and "has no effect" in out, out
    flags = ["--rl.environment", f"{ENVS}:CountingTurns", "--rl.rewards", "[]", "--rl.max_episode_tokens", "32"]
    code, out = check(tmp_path, capsys, *flags)
    assert code == 0, out  # an environment that rewards its steps needs no reward function


def run(tmp_path, capsys, train=None, **rl):
    """`ditty run` of a tiny GRPO recipe with `rl` changed; an episode's budget fits the model's 64
    positions after a 32-token prompt unless `rl` sets one."""
    config = grpo_config(tmp_path, train=dict(steps=4, **(train or {})), checkpoint=dict(every=2))
    config = with_rl(config, **{"max_episode_tokens": 32, **rl})
    path = tmp_path / "grpo.toml"
    path.write_text(recipe_to_toml(config))
    code = main(["run", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_an_environment_whose_step_raises_stops_the_run_naming_it_and_the_row(tmp_path, capsys, monkeypatch):
    from tests.rl.environments_for_tests import FailsAtStep

    FailsAtStep.resets = 0
    monkeypatch.setenv("DITTY_TEST_ENV_FAIL_AT", "17")  # 8 episodes a step: the third step's first episode
    code, out = run(tmp_path, capsys, environment=f"{ENVS}:FailsAtStep", rewards=[])
    assert code == 2, out
    assert f"environment {ENVS}:FailsAtStep raised RuntimeError in step (turn 1): the simulator crashed" in out
    assert "(row {'prompt': '" in out and "'completion': '" in out and "`rl.environment`" in out
    assert "Traceback" not in out
    checkpoints = Path(tmp_path / "run" / "checkpoints")
    assert sorted(n for n in os.listdir(checkpoints) if n.startswith("step-")) == ["step-2"]
    assert checkpoint_problems(checkpoints / "step-2") == []
    assert not (tmp_path / "run" / "final").exists()


def test_an_environment_whose_step_never_returns_stops_at_its_timeout(tmp_path, capsys, monkeypatch):
    """A step that sleeps 600 s with rl.environment_timeout_s = 5: exit 2 naming the environment well
    within a minute, the checkpoint before it intact."""
    import time

    monkeypatch.setenv("DITTY_TEST_ENV_HANG_AT", "17")  # 8 episodes a step: the third step's first episode
    started = time.monotonic()
    code, out = run(tmp_path, capsys, environment=f"{ENVS}:HangsInStep", rewards=[], environment_timeout_s=5.0)
    took = time.monotonic() - started
    assert code == 2, out
    assert (
        f"environment {ENVS}:HangsInStep did not return from step (turn 1) within rl.environment_timeout_s = 5 s" in out
    )
    assert "`rl.environment`" in out and "Traceback" not in out, out
    assert took < 120, took
    checkpoints = Path(tmp_path / "run" / "checkpoints")
    assert sorted(n for n in os.listdir(checkpoints) if n.startswith("step-")) == ["step-2"]
    assert checkpoint_problems(checkpoints / "step-2") == []
    assert not (tmp_path / "run" / "final").exists()


def test_an_environment_that_raises_keyboard_interrupt_is_not_a_ctrl_c(tmp_path, capsys):
    code, out = run(tmp_path, capsys, environment=f"{ENVS}:InterruptsInStep", rewards=[])
    assert code == 2, out
    assert f"environment {ENVS}:InterruptsInStep raised KeyboardInterrupt in step (turn 1)" in out, out
    assert "Traceback" not in out and "interrupted" not in out.splitlines()[-1]


class _Slow:
    """An environment one of whose calls (the constructor, reset, step, reward_columns) sleeps."""

    def __init__(self, slow="", sleep_s=30.0):
        self.slow, self.sleep_s = slow, sleep_s
        self._wait("make")

    def _wait(self, name):
        if self.slow == name:
            import time

            time.sleep(self.sleep_s)

    def reset(self, row):
        self._wait("reset")
        return row["prompt"]

    def step(self, completion):
        from ditty.objectives.environments.protocol import StepResult

        self._wait("step")
        return StepResult(done=True)

    def reward_columns(self):
        self._wait("reward_columns")
        return {}


@pytest.mark.parametrize("slow", ["make", "reset", "step", "reward_columns"])
def test_every_call_into_an_environment_is_bounded_by_its_timeout(slow):
    import time
    from types import SimpleNamespace

    from ditty.objectives.environments.episodes import Episode, EpisodeEnvironment
    from ditty.objectives.environments.protocol import EnvironmentFailure

    rl = SimpleNamespace(reward_timeout_s=0.0, environment_timeout_s=0.5)
    env = EpisodeEnvironment(lambda: _Slow(slow), "Slow", [], None, rl)
    row = {"prompt": "1+1=", "completion": "2"}
    started = time.monotonic()
    with pytest.raises(EnvironmentFailure, match=re.escape("within rl.environment_timeout_s = 0.5 s")) as failed:
        if slow in ("make", "reset"):
            env.open(row)
        made = _Slow()
        made.slow = slow
        episode = Episode(row=row, environment=made, prompt_ids=[], conversation=None, turn_rewards=[0.0])
        env.step(episode, "2")
        env.environment_columns([episode], set())
    assert f"did not return from {'its constructor' if slow == 'make' else slow}" in str(failed.value)
    assert time.monotonic() - started < 5


def test_a_reward_function_that_hangs_in_an_episode_stops_at_the_timeout(tmp_path, capsys):
    from tests.rl import rewards_for_tests

    rewards_for_tests.CALLS["count"] = 0
    rewards_for_tests.FAIL_FROM_CALL["value"] = 3  # steps 1 and 2 score, step 3 hangs
    code, out = run(
        tmp_path,
        capsys,
        tools=["ditty.objectives.environments.tools.builtin_tools:calculator"],
        rewards=["tests.rl.rewards_for_tests:hangs_later"],
        reward_timeout_s=1.0,
        max_new_tokens=4,
        max_turns=2,
        max_episode_tokens=16,
    )
    assert code == 2, out
    assert "hangs_later did not return within rl.reward_timeout_s = 1 s" in out, out
    assert not (tmp_path / "run" / "final").exists()


def test_a_tool_episode_trains_and_logs_its_metrics(tmp_path, capsys):
    code, out = run(
        tmp_path,
        capsys,
        train=dict(eval_samples=8, eval_at_start=True),
        tools=["ditty.objectives.environments.tools.builtin_tools:calculator", f"{ENVS}:echo"],
        max_new_tokens=6,
        max_turns=2,
        max_episode_tokens=32,
    )
    assert code == 0, out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "loss" in r)
    for name in ("env/turns", "env/tool_calls", "env/tool_errors", "env/episode_tokens", "env/truncated"):
        assert name in step, sorted(step)
    assert rows[0]["step"] == 0 and "loss" not in rows[0]  # the evaluation before the first update
    for evaluated in (rows[0], rows[-1]):
        assert "val_exact_match" in evaluated and "val_env/well_formed_calls" in evaluated

    # `ditty generate --tools` plays one greedy episode of the final model with the tools
    tools = '["ditty.objectives.environments.tools.builtin_tools:calculator"]'
    run_dir = str(tmp_path / "run")
    assert main(["generate", run_dir, "12*3=", "--tools", tools, "--max-new-tokens", "5", "--max-turns", "2"]) == 0
    from ditty.train.generate import generate_episode

    text = generate_episode(
        run_dir, "12*3=", ["ditty.objectives.environments.tools.builtin_tools:calculator"], max_new_tokens=5
    )
    assert capsys.readouterr().out.strip() == text.strip()
    assert main(["generate", run_dir, "12*3=", "--tools", "[1]"]) == 2
    assert (
        main(["generate", run_dir, "12*3=", "--tools", '["ditty.objectives.environments.tools.builtin_tools:abacus"]'])
        == 2
    )
    assert "--tools[0]" in capsys.readouterr().err
    assert main(["generate", run_dir, "12*3=", "--tools", f'["{ENVS}:NOT_A_CLASS"]']) == 2
    assert (
        "`--tools[0]` tests.rl.environments_for_tests:NOT_A_CLASS is a int, not a function" in capsys.readouterr().err
    )


@pytest.mark.slow
def test_a_one_turn_environment_gives_todays_losses_on_tiny_grpo(tmp_path, tiny_llama_dir):
    """tiny_grpo's first three steps with two reward functions (exact_match, and a hash of the text
    so that the tiny start's rewards differ), and with the same reward written as an environment of
    the reset/step protocol: the same rollouts, losses and gradients."""
    from tests.objectives.pinned_runs import COMMON

    def three_steps(name, *flags):
        out = tmp_path / name
        common = ["--model.path", tiny_llama_dir, "--run.output_dir", str(out), *COMMON, "--train.steps", "3"]
        common += ["--scheduler.warmup_steps", "1", "--rl.guidance_column", ""]  # every completion sampled
        assert main(["run", "tiny_grpo", *common, "--train.eval_samples", "0", *flags]) == 0
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        keys = ("loss", "grad_norm", "reward", "reward_std", "completions/mean_length", "clip_ratio/region_mean")
        return [[r[k] for k in keys] for r in rows if "loss" in r]

    rewards = '["ditty.objectives.rewards.builtin_rewards:exact_match","tests.rl.rewards_for_tests:text_hash_reward"]'
    functions = three_steps("functions", "--rl.rewards", rewards)
    environment = three_steps(
        "environment",
        *("--rl.environment", f"{ENVS}:ExactMatchAndHashOneTurn", "--rl.rewards", "[]"),
        *("--rl.max_episode_tokens", "4"),  # the one turn's 4 tokens, within the model's positions
    )
    assert len(functions) == 3 and len({row[2] for row in functions}) > 1 and functions[0][0] != 0
    for ours, today in zip(environment, functions):
        assert ours == pytest.approx(today, rel=1e-6, abs=1e-9)


def test_an_environment_that_calls_sys_exit_stops_the_run_with_exit_2(tmp_path, capsys):
    code, out = run(tmp_path, capsys, environment=f"{ENVS}:ExitsInStep", rewards=[])
    assert code == 2, out
    assert f"environment {ENVS}:ExitsInStep raised SystemExit in step (turn 1)" in out and "Traceback" not in out
    assert not (tmp_path / "run" / "final").exists()


class _Scripted:
    """An environment whose reset, step and reward_columns answer what the test gives them."""

    def __init__(self, reset=None, step=None, columns=None):
        self.answers = {"reset": reset, "step": step, "columns": columns}

    def _answer(self, name, default):
        answer = self.answers[name]
        if isinstance(answer, BaseException):
            raise answer
        return default if answer is None else answer

    def reset(self, row):
        return self._answer("reset", row["prompt"])

    def step(self, completion):
        from ditty.objectives.environments.protocol import StepResult

        return self._answer("step", StepResult(done=True))

    def reward_columns(self):
        return self._answer("columns", {})


def _step_result(**fields):
    from ditty.objectives.environments.protocol import StepResult

    result = StepResult(done=True)
    for name, value in fields.items():
        setattr(result, name, value)
    return result


@pytest.mark.parametrize(
    "environment, words",
    [
        (lambda: _Scripted(reset=SystemExit(0)), "raised SystemExit in reset"),
        (lambda: _Scripted(reset=42), "reset returned a int, not chat messages"),
        (lambda: _Scripted(reset=["1+1="]), "reset returned a list whose item 0 is '1+1=', not a chat message"),
        (lambda: _Scripted(reset=[{"role": "user"}]), "item 0 is {'role': 'user'}, not a chat message"),
        (lambda: _Scripted(step=SystemExit(3)), "raised SystemExit in step (turn 0)"),
        (lambda: _Scripted(step=_step_result(metrics={"x": "abc"})), "metrics['x'] = 'abc', not a finite number"),
        (lambda: _Scripted(step=_step_result(metrics=None)), "metrics = None, not a mapping of names to numbers"),
        (lambda: _Scripted(step=_step_result(rewards={"part": "x"})), "rewards['part'] = 'x', not a finite number"),
        (lambda: _Scripted(step=_step_result(reward=float("nan"))), "the reward nan, not a finite number"),
        (lambda: _Scripted(step=_step_result(observation=42)), "the observation a int, not chat messages"),
        (lambda: _Scripted(step=_step_result(observation={"role": "user"})), "the observation a dict, not chat"),
        (lambda: _Scripted(columns=RuntimeError("no score")), "raised RuntimeError in reward_columns: no score"),
        # What the data path refuses in a chat row is refused in an observation too.
        (lambda: _Scripted(reset=[{"role": "user", "content": None}]), "message 0's content is None, not text"),
        (lambda: _Scripted(reset=[{"role": "user", "content": 7}]), "message 0's content is 7, not text"),
        (lambda: _Scripted(reset=[{"role": "wizard", "content": "hi"}]), "message 0 has the role 'wizard'"),
        (lambda: _Scripted(reset=[{"role": "tool", "content": "4"}]), "has the role 'tool' but follows no assistant"),
        (
            lambda: _Scripted(step=_step_result(done=False, observation=[{"role": "user", "content": {"a": 1}}])),
            "message 0's content is {'a': 1}, not text",
        ),
        (
            lambda: _Scripted(step=_step_result(done=False, observation=[{"role": "wizard", "content": "x"}])),
            "message 0 has the role 'wizard'",
        ),
        (lambda: _Scripted(step=_step_result(done="no")), "done = 'no', not True or False"),
        (lambda: _Scripted(step=_step_result(done=None)), "done = None, not True or False"),
        (lambda: _Scripted(step=_step_result(metrics={"turns": 1.0})), "metrics['turns']: env/turns is ditty's own"),
        (
            lambda: _Scripted(step=_step_result(metrics={"truncated": 0.0})),
            "metrics['truncated']: env/truncated is ditty's own",
        ),
    ],
)
def test_what_an_environment_answers_is_checked_naming_the_field(environment, words):
    """An environment's answers are checked where they arrive: a wrong one is an EnvironmentFailure
    (exit 2) naming what was wrong, never a traceback from the renderer or the metrics, a silent exit
    nor a silent result (a non-bool done that ends the episode, a metric that overwrites ditty's own)."""
    from types import SimpleNamespace

    from ditty.objectives.environments.episodes import Episode, EpisodeEnvironment
    from ditty.objectives.environments.protocol import EnvironmentFailure

    env = EpisodeEnvironment(environment, "Scripted", [], None, SimpleNamespace(reward_timeout_s=0.0))
    row = {"prompt": "1+1=", "completion": "2"}
    with pytest.raises(EnvironmentFailure, match=re.escape(words)):
        made = environment()
        if made.answers["reset"] is not None:
            env.open(row)
        episode = Episode(row=row, environment=made, prompt_ids=[], conversation=None, turn_rewards=[0.0])
        env.step(episode, "2")
        env.environment_columns([episode], set())


def test_a_custom_environment_reports_its_own_metrics_in_training_and_at_evaluation(tmp_path, capsys):
    """An environment of one's own plays episodes of tiny GRPO on the built-in data; its metric is logged
    as env/right, and held-out episodes report val_env/right, never the tool environment's figures."""
    code, out = run(
        tmp_path, capsys, train=dict(eval_samples=8), environment=f"{ENVS}:GuessTheSum", rewards=[], max_turns=2
    )
    assert code == 0, out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("env/right" in r for r in records if "loss" in r)
    evaluated = [r for r in records if "val_exact_match" in r]
    assert evaluated and all("val_env/right" in r and "val_env/tool_calls" not in r for r in evaluated)


def test_an_environment_is_built_with_the_recipes_arguments(tmp_path, capsys):
    """rl.environment_args reaches the constructor of every episode's environment: NeedsALevel, which
    ditty cannot build without its level, plays episodes that step at that level (env/level), and an
    original Ditty environment wrapped by as_environment gets them too."""
    from tests.rl.environments_for_tests import OriginalGameWithALevel

    own = f"{ENVS}:NeedsALevel"
    (tmp_path / "own").mkdir()
    (tmp_path / "original").mkdir()
    code, out = run(tmp_path / "own", capsys, environment=own, environment_args={"level": 3}, rewards=[])
    assert code == 0, out
    records = [json.loads(line) for line in (tmp_path / "own" / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 4 and all(r["env/level"] == pytest.approx(3.0 * r["env/turns"]) for r in steps), steps

    OriginalGameWithALevel.levels = []
    wrapped = f"{ENVS}:WrappedOriginalNeedingALevel"
    code, out = run(tmp_path / "original", capsys, environment=wrapped, environment_args={"level": 5}, rewards=[])
    assert code == 0, out
    assert len(OriginalGameWithALevel.levels) >= 4 * 8 and set(OriginalGameWithALevel.levels) == {5}


def test_budgets_that_cut_most_samples_warn_in_the_first_rollouts(tmp_path, capsys, caplog):
    """A random model never ends its answer within rollout.max_new_tokens = 4: the run says so once,
    after its first three rollouts, naming the key and its value; episodes name their three budgets."""
    from tests.rl.helpers import save_turn_ending_llama

    def warned() -> str:
        text = "\n".join(r.getMessage() for r in caplog.records if "rollouts were cut" in r.getMessage())
        caplog.clear()
        return text

    caplog.set_level("WARNING", logger="ditty.train")
    (tmp_path / "one").mkdir()
    code, out = run(tmp_path / "one", capsys, rewards=["tests.rl.rewards_for_tests:text_hash_reward"])
    assert code == 0, out
    text = warned()
    assert text.count("of the samples of the first 3 rollouts were cut") == 1, text
    assert "at rollout.max_new_tokens = 4" in text

    (tmp_path / "episodes").mkdir()
    code, out = run(tmp_path / "episodes", capsys, environment=f"{ENVS}:CountingTurns", rewards=[], max_turns=1)
    assert code == 0, out
    text = warned()
    assert "before their episode ended" in text and "rl.max_turns = 1" in text and "rl.max_episode_tokens" in text

    # A model that ends its turns within a few tokens, with room for them: no warning.
    model = save_turn_ending_llama(tmp_path / "model", eos_weight=2.0)
    config = grpo_config(tmp_path / "ends", train=dict(steps=3), max_new_tokens=16)
    config = replace(config, model=replace(config.model, init="pretrained", path=model, config={}))
    path = tmp_path / "ends.toml"
    path.write_text(recipe_to_toml(with_rl(config, rewards=["tests.rl.rewards_for_tests:text_hash_reward"])))
    assert main(["run", str(path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "ends" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["completions/clipped_ratio"] for r in rows if "loss" in r) / 3 < 0.5
    assert warned() == ""


def test_rows_without_answers_report_no_exact_match(tmp_path, capsys):
    """A game whose environment holds the answer (rows of a prompt alone): the held-out episodes report
    val_reward and the environment's metrics, and no val_exact_match of 0."""
    rows = tmp_path / "games.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{a}="}) + "\n" for a in range(40)))
    config = grpo_config(tmp_path, train=dict(steps=2, eval_every=2, eval_samples=8), checkpoint=dict(every=0))
    data = replace(config.data, source="file", path=str(rows), name=None, num_samples=None, val_fraction=0.2)
    config = with_rl(replace(config, data=data), environment=f"{ENVS}:CountingTurns", rewards=[], max_episode_tokens=32)
    path = tmp_path / "games.toml"
    path.write_text(recipe_to_toml(config))
    assert main(["run", str(path)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "val_reward" in r]
    assert evaluated and all("val_env/turns" in r and "val_exact_match" not in r for r in evaluated), evaluated


def test_an_environment_offered_tools_trains_and_lists_them_in_the_prompt(tmp_path, capsys):
    """rl.environment beside rl.tools: the environment (CodeLock, with a tool of its own) plays the
    episodes, every tool is listed in the chat template's prompt, and both the tool counts and the
    environment's own metrics are logged; a name both offer is exit 2 naming rl.tools."""
    from types import SimpleNamespace

    from ditty.data.tokenizer import byte_tokenizer
    from ditty.objectives.rl.row import build_environment
    from tests.rl.helpers import grpo_config

    calculator = "ditty.objectives.environments.tools.builtin_tools:calculator"
    settings = dict(environment=f"{ENVS}:CodeLock", tools=[calculator], rewards=[], max_turns=2)
    code, out = run(tmp_path, capsys, max_new_tokens=6, max_episode_tokens=24, **settings)
    assert code == 0, out
    assert "has no effect" not in out, out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    for name in ("env/right", "env/peeks", "env/tool_calls", "env/tool_calls/peek", "env/tool_calls/calculator"):
        assert all(name in r for r in steps), (name, sorted(steps[0]))

    tokenizer = byte_tokenizer()
    tokenizer.chat_template = (
        '{% for t in tools %}[{{ t["function"]["name"] }}]{% endfor %}{{ messages[0]["content"] }}'
    )
    config = with_rl(grpo_config(tmp_path), **settings)
    episodes = build_environment(SimpleNamespace(config=config, tokenizer=tokenizer), [])
    prompt_ids, _ = episodes.renderer.prompt([{"role": "user", "content": "1+1="}])
    assert tokenizer.decode(prompt_ids, skip_special_tokens=True) == "[calculator][peek]1+1="

    clash = with_rl(config, environment=f"{ENVS}:OffersTheCalculator")
    with pytest.raises(Exception, match="names a tool 'calculator' that environment .*OffersTheCalculator's tools"):
        build_environment(SimpleNamespace(config=clash, tokenizer=tokenizer), [])
