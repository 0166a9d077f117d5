"""Reward functions (ditty.objectives.rewards.functions, builtin_rewards): references resolve or say why not,
wrong signatures are refused before any run, every returned value is checked, errors name the
function and the prompt, weights combine them, and the original library's reward_fn adapts."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.objectives import builtin_rewards
from ditty.objectives.rewards.functions import (
    RewardFunctionError,
    TaskReward,
    load_reward_functions,
    resolve_reward_functions,
    reward_metrics,
    score_completions,
)

SAMPLES = "tests.objectives.reward_samples"


def keys_and_messages(error: RecipeError) -> list[tuple[str, str]]:
    return [(p.key, p.message) for p in error.problems]


def test_trl_style_references_load_with_their_weights():
    functions = load_reward_functions([f"{SAMPLES}:trl_style", f"{SAMPLES}:with_prompts"], [2.0, 0.5])
    assert [(f.name, f.weight, f.key) for f in functions] == [
        (f"{SAMPLES}:trl_style", 2.0, "rl.rewards[0]"),
        (f"{SAMPLES}:with_prompts", 0.5, "rl.rewards[1]"),
    ]
    scores = score_completions(functions, ["1+1=", "2+2="], ["2", "5 "], {"answer": ["2", "4"]})
    assert scores.per_function[f"{SAMPLES}:trl_style"].tolist() == [1.0, 0.0]
    assert scores.per_function[f"{SAMPLES}:with_prompts"].tolist() == [1.0, 2.0]
    assert scores.total.tolist() == [2.0 * 1 + 0.5 * 1, 2.0 * 0 + 0.5 * 2]


def test_every_bad_reference_is_reported_at_once_with_its_key():
    with pytest.raises(RecipeError) as caught:
        load_reward_functions(
            [
                "no_such_module_xyz:fn",
                f"{SAMPLES}:missing",
                "not a reference",
                f"{SAMPLES}:NOT_A_FUNCTION",
                f"{SAMPLES}:original_style",
                f"{SAMPLES}:positional_only",
                f"{SAMPLES}:asynchronous",
            ],
            [1.0, 1.0],
        )
    found = keys_and_messages(caught.value)
    keys = [key for key, _ in found]
    assert keys == [
        "rl.reward_weights",
        "rl.rewards[0]",
        "rl.rewards[1]",
        "rl.rewards[2]",
        "rl.rewards[3]",
        "rl.rewards[4]",
        "rl.rewards[5]",
        "rl.rewards[6]",
    ]
    text = str(caught.value)
    assert "2 weights for 7 reward functions" in text
    assert "cannot import module 'no_such_module_xyz'" in text
    assert "has no attribute 'missing'" in text
    assert 'not of the form "package.module:Name"' in text
    assert "is a int, not a function" in text
    assert "takes no 'prompts' or 'completions' argument" in text and "TaskReward" in text
    assert "positional-only" in text
    assert "is async (async def)" in text
    assert "fn(prompts, completions, **columns) -> list[float]" in text  # the fix names TRL's signature


def test_named_columns_are_checked_against_the_data_when_known():
    _, problems = resolve_reward_functions([f"{SAMPLES}:trl_style"], columns=["prompt", "solution"])
    assert problems and "needs the column(s) answer" in problems[0].message
    functions, problems = resolve_reward_functions([f"{SAMPLES}:trl_style"], columns=["prompt", "answer"])
    assert not problems and len(functions) == 1


def test_weights_must_be_finite_and_the_list_not_empty():
    _, problems = resolve_reward_functions([f"{SAMPLES}:with_prompts"], [math.nan])
    assert [p.key for p in problems] == ["rl.reward_weights[0]"]
    _, problems = resolve_reward_functions([])
    assert [p.key for p in problems] == ["rl.rewards"]


def score_one(reference, prompts, completions):
    return score_completions(load_reward_functions([reference]), prompts, completions)


def test_a_raising_function_names_itself_and_the_prompt_that_broke_it():
    with pytest.raises(RewardFunctionError) as caught:
        score_one(f"{SAMPLES}:raises_on_seven", ["1+2=", "3+7=", "4+4="], ["3", "10", "8"])
    message = str(caught.value)
    assert "rl.rewards[0]" in message and f"{SAMPLES}:raises_on_seven" in message
    assert "raised IndexError" in message and "prompt '3+7='" in message
    assert isinstance(caught.value, RecipeError)  # exit code 2 from the command line
    assert isinstance(caught.value.__cause__, IndexError)


@pytest.mark.parametrize(
    "name,needle,prompt",
    [
        ("one_short", "returned 2 values for 3 completions", "'a'"),
        ("nan_for_long", "returned nan for a completion", "'b'"),
        ("none_for_empty", "returned None for a completion", "'c'"),
        ("returns_a_number", "returned a float, not a list of numbers", "'a'"),
    ],
)
def test_wrong_values_are_refused_naming_the_function_and_prompt(name, needle, prompt):
    with pytest.raises(RewardFunctionError) as caught:
        score_one(f"{SAMPLES}:{name}", ["a", "b", "c"], ["x", "long", ""])
    message = str(caught.value)
    assert needle in message and f"{SAMPLES}:{name}" in message and f"prompt {prompt}" in message


def test_the_error_survives_a_trip_between_ranks():
    with pytest.raises(RewardFunctionError) as caught:
        score_one(f"{SAMPLES}:one_short", ["a", "b"], ["x", "y"])
    copy = pickle.loads(pickle.dumps(caught.value))
    assert type(copy) is RewardFunctionError and str(copy) == str(caught.value)


def test_numpy_and_tensor_results_are_accepted():
    functions = load_reward_functions([lambda prompts, completions, **_: np.ones(len(completions))])
    assert score_completions(functions, ["p"], ["c"]).total.tolist() == [1.0]
    functions = load_reward_functions([lambda prompts, completions, **_: torch.zeros(len(completions))])
    assert score_completions(functions, ["p", "q"], ["c", "d"]).total.tolist() == [0.0, 0.0]


def test_metrics_per_function():
    functions = load_reward_functions([f"{SAMPLES}:with_prompts"])
    scores = score_completions(functions, ["a", "b", "c"], ["x", "yy", "zzzz"])
    metrics = reward_metrics(scores.per_function)
    assert metrics[f"rewards/{SAMPLES}:with_prompts/mean"].item() == pytest.approx(7 / 3)
    assert metrics[f"rewards/{SAMPLES}:with_prompts/std"].item() == pytest.approx(np.std([1, 2, 4], ddof=1))


# ---- the original library's reward_fn(task, completion_text) ----


@pytest.mark.parametrize(
    "result,reward,metrics",
    [
        (0.75, 0.75, {}),
        ((1.0, {"parsed": 1.0}), 1.0, {"parsed": 1.0}),
        ({"reward": 0.5, "metrics": {"n": 2}}, 0.5, {"n": 2.0}),
    ],
)
def test_task_reward_adapts_float_pair_and_dict(result, reward, metrics):
    seen = []

    def reward_fn(task, completion_text):
        seen.append((task, completion_text))
        return result

    functions = load_reward_functions([TaskReward(reward_fn)])
    assert functions[0].name == "reward_fn"
    scores = score_completions(functions, ["1+1="], [[{"role": "assistant", "content": "2"}]], {"answer": ["2"]})
    assert seen == [({"prompt": "1+1=", "answer": "2"}, "2")]
    assert scores.total.tolist() == [reward]
    assert {k.rsplit("/", 1)[1]: v.item() for k, v in scores.details.items()} == metrics
    assert set(reward_metrics(scores.per_function, scores.details)) >= set(scores.details)


def test_task_reward_refuses_a_dict_without_reward():
    functions = load_reward_functions([TaskReward(lambda task, text: {"score": 1.0}, name="scorer")])
    with pytest.raises(RewardFunctionError, match="without a 'reward' key"):
        score_completions(functions, ["p"], ["c"])


# ---- built-in rewards ----


def test_builtin_references_resolve_with_trls_signature():
    names = ["exact_match", "addition_exact_match", "integer_format", "think_answer_format", "length_penalty"]
    functions = load_reward_functions([f"ditty.objectives.rewards.builtin_rewards:{name}" for name in names])
    assert len(functions) == len(names)


@pytest.mark.parametrize(
    "written, meant",
    [("exact_match", "exact_match"), ("exact-match", "exact_match"), ("length_penalty", "length_penalty")],
)
def test_a_bare_built_in_name_is_answered_with_its_reference(written, meant):
    _, problems = resolve_reward_functions([written])
    assert [p.key for p in problems] == ["rl.rewards[0]"]
    assert (
        problems[0].fix == f'write "ditty.objectives.rewards.builtin_rewards:{meant}" for the built-in reward function'
    )


@pytest.mark.parametrize("written", ["runs/no_such_reward/final", "regex_reward", "share_in_place", "xyz"])
def test_a_path_or_a_name_of_no_reward_function_keeps_the_reward_model_fix(written):
    _, problems = resolve_reward_functions([written])
    assert "reward model's final/" in problems[0].fix


def test_exact_match_on_the_builtin_addition_task():
    from ditty.data.builtin import generate_problems

    problems = generate_problems("addition", 6)
    prompts = [p for p, _ in problems]
    answers = [a for _, a in problems]
    completions = [answers[0], answers[1] + "1", " " + answers[2] + "\n", "x", answers[4], "-" + answers[5]]
    expected = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert builtin_rewards.addition_exact_match(prompts, completions) == expected
    assert builtin_rewards.exact_match(prompts, completions, completion=answers) == expected
    assert builtin_rewards.exact_match(prompts, completions, answer=answers) == expected
    with pytest.raises(KeyError, match="answer"):
        builtin_rewards.exact_match(prompts, completions)


def test_addition_reward_on_a_foreign_prompt_stops_the_run_naming_it():
    functions = load_reward_functions(["ditty.objectives.rewards.builtin_rewards:addition_exact_match"])
    with pytest.raises(RewardFunctionError, match="prompt 'rev abcd='"):
        score_completions(functions, ["1+2=", "rev abcd="], ["3", "dcba"])


def test_format_and_length_rewards():
    assert builtin_rewards.integer_format(["p"] * 4, ["42", " -7\n", "4 2", "four"]) == [1.0, 1.0, 0.0, 0.0]
    think = ["<think>a+b</think> <answer>3</answer>", "<answer>3</answer>", "<think>x</think><answer>1</answer> more"]
    assert builtin_rewards.think_answer_format(["p"] * 3, think) == [1.0, 0.0, 0.0]
    custom = builtin_rewards.regex_reward(r"[a-z]+", name="lowercase")
    assert custom.__name__ == "lowercase" and custom(["p", "p"], ["abc", "aBc"]) == [1.0, 0.0]
    penalty = builtin_rewards.make_length_penalty(soft_limit=4, hard_limit=8, penalty=2.0)
    assert penalty(["p"] * 4, ["abc", "abcdef", "abcdefgh", "a" * 20]) == [0.0, -1.0, -2.0, -2.0]
    assert builtin_rewards.length_penalty(["p"], ["a" * 384]) == [-0.5]
    with pytest.raises(ValueError, match="soft_limit"):
        builtin_rewards.make_length_penalty(soft_limit=10, hard_limit=5)


def test_the_compiler_can_check_references_without_importing_torch():
    modules = "ditty.objectives.rewards.functions, ditty.objectives.rewards.builtin_rewards"
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_a_function_that_edits_a_column_does_not_change_what_the_next_one_sees():
    functions = load_reward_functions([f"{SAMPLES}:strips_answers", f"{SAMPLES}:sees_answers"])
    answers = [" x ", " x "]
    chat = [[{"role": "assistant", "content": "y"}], [{"role": "assistant", "content": "z"}]]
    scores = score_completions(functions, ["p", "q"], chat, {"answer": answers})
    assert scores.per_function[f"{SAMPLES}:sees_answers"].tolist() == [1.0, 1.0]
    assert answers == [" x ", " x "] and chat[0][0]["content"] == "y"  # the caller's rows are untouched


def test_a_function_that_calls_sys_exit_is_a_failing_reward():
    with pytest.raises(RewardFunctionError) as caught:
        score_one(f"{SAMPLES}:exits", ["a", "b"], ["x", "y"])
    message = str(caught.value)
    assert f"reward function {SAMPLES}:exits called sys.exit(3)" in message and "prompt 'a'" in message


@pytest.mark.parametrize("name", ["never_returns", "catches_everything"])
def test_a_function_that_never_returns_is_stopped_after_the_timeout(name):
    import signal
    import time

    functions = load_reward_functions([f"{SAMPLES}:{name}"])
    started = time.monotonic()
    with pytest.raises(RewardFunctionError) as caught:
        score_completions(functions, ["a", "b"], ["x", "y"], timeout_s=0.3)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert f"reward function {SAMPLES}:{name} did not return within rl.reward_timeout_s = 0.3 s" in message
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left behind
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_rewards_that_overflow_together_are_refused():
    functions = load_reward_functions([f"{SAMPLES}:huge", f"{SAMPLES}:huge"])
    with pytest.raises(RewardFunctionError) as caught:
        score_completions(functions, ["a"], ["x"])
    message = str(caught.value)
    assert f"the weighted sum of {SAMPLES}:huge, {SAMPLES}:huge is inf for a completion" in message


def test_digit_match_gives_partial_credit_for_near_misses():
    from ditty.objectives.rewards.builtin_rewards import digit_match

    completions = ["56088", "56089", " 56188 ", "5608", "", [{"role": "assistant", "content": "56088"}]]
    got = digit_match(prompts=[""] * 6, completions=completions, completion=["56088"] * 6)
    assert got == [1.0, 0.8, 0.8, 0.0, 0.0, 1.0]


def test_call_expression_match_scores_the_first_calls_copy_of_the_prompt():
    from ditty.objectives.rewards.builtin_rewards import call_expression_match

    def calls(*expressions):
        return [{"name": "calculator", "arguments": {"expression": e}} for e in expressions]

    prompts = ["633*148="] * 5 + [[{"role": "user", "content": "12*34="}]]
    tool_calls = [calls("633*148"), calls("733*148"), calls("633*14"), [], calls("1*1", "633*148"), calls("12*34")]
    got = call_expression_match(prompts, ["x"] * 6, tool_calls=tool_calls)
    assert got == [1.0, 6 / 7, 0.0, 0.0, 0.0, 1.0]  # only the first call counts: calling again earns nothing
    with pytest.raises(KeyError, match="rl.tools"):
        call_expression_match(["1*2="], ["2"])
