"""Reward functions for reinforcement learning: resolving `"package.module:function"` references,
checking their signature, calling them with a check of every value, weighting them, and adapting
the original library's `reward_fn(task, completion_text)`.

The signature is TRL's, so users' TRL reward functions work unchanged:
`fn(prompts, completions, **columns) -> list[float]`, called with keywords: `prompts` and
`completions` (strings, or chat messages for conversational data) and every other column of the
prompt rows, one value per completion. A function may name the columns it needs
(`def f(completions, answer, **kwargs)`).

How the trainer plugs it in (`[rl] rewards`, `reward_weights`):
- the recipe compiler calls `resolve_reward_functions(cfg.rl.rewards, cfg.rl.reward_weights)` and
  reports the Problems with the rest (unresolvable reference, not callable, wrong signature,
  weights that do not match); the trainer calls `load_reward_functions` (a RecipeError if any);
- after each rollout, `score_completions(functions, prompts, completions, columns, timeout_s=...)`
  with every prompt and column repeated once per completion of its group; each function gets its
  own copy of them (one function's edits never reach the next). A function that raises, calls
  sys.exit(), runs past `rl.reward_timeout_s`, returns the wrong number of values, None, NaN or
  infinity, or whose weighted sum with the others overflows, stops the run with a
  `RewardFunctionError` (a RecipeError: exit 2, no traceback) naming the function and the prompt,
  before any update, so the last checkpoint is untouched. `os._exit()` ends the process at once and
  cannot be caught in-process;
- `reward_metrics` of the gathered per-function rewards gives rewards/NAME/mean and /std.

Nothing here imports torch at module level: the compiler imports this module to check references.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from ditty._utils.deadline import DeadlinePassed, deadline
from ditty.config.errors import Problem, RecipeError
from ditty.config.references import is_code_reference, resolve_reference

if TYPE_CHECKING:
    from torch import Tensor

SIGNATURE = "fn(prompts, completions, **columns) -> list[float]"
SIGNATURE_FIX = f"define it as {SIGNATURE} (TRL's reward-function signature)"


class RewardFunctionError(RecipeError):
    """A reward function failed on a batch of completions (exit code 2, no traceback)."""


@dataclass(frozen=True)
class RewardFunction:
    name: str
    """How messages and metrics name it: the reference, or the function's module:qualname."""
    function: Callable[..., Any]
    weight: float = 1.0
    key: str = "rl.rewards"
    """The recipe key that named it ("rl.rewards[0]")."""


@dataclass
class RewardScores:
    total: "Tensor"
    """[N] weighted sum of the functions' rewards, one per completion (float64)."""
    per_function: "dict[str, Tensor]" = field(default_factory=dict)
    """[N] each function's unweighted rewards."""
    details: "dict[str, Tensor]" = field(default_factory=dict)
    """[N] extra per-completion metrics a function reported ("rewards/NAME/METRIC"), NaN where absent."""


def resolve_reward_functions(
    references: Sequence[Union[str, Callable[..., Any]]],
    weights: Optional[Sequence[float]] = None,
    *,
    key: str = "rl.rewards",
    weights_key: str = "rl.reward_weights",
    columns: Optional[Sequence[str]] = None,
) -> tuple[list[RewardFunction], list[Problem]]:
    """(the functions, []) or ([], every Problem found); never raises for a user mistake.
    `references` are "package.module:function" strings or callables (the Python API); `columns`,
    when known, are the data columns a function's named parameters must be among."""
    problems: list[Problem] = []
    if not references:
        problems.append(Problem(key, "names no reward function", fix='list at least one, e.g. ["my_rewards:correct"]'))
    if weights is not None and len(weights) != len(references):
        problems.append(
            Problem(
                weights_key,
                f"has {len(weights)} weights for {len(references)} reward functions",
                fix=f"give one weight per function in {key}, or leave it out (every weight 1.0)",
            )
        )
    for index, weight in enumerate(weights or ()):
        if not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            problems.append(Problem(f"{weights_key}[{index}]", f"{weight!r} is not a finite number"))
    functions = []
    for index, reference in enumerate(references):
        item_key = f"{key}[{index}]"
        if callable(reference) and not isinstance(reference, str):
            function, name = reference, _callable_name(reference)
        elif not is_code_reference(str(reference)):  # a reward model's directory (TRL's reward_funcs take one)
            from ditty.objectives.rewards.scorer import RewardModelScorer, reward_model_problems

            found = reward_model_problems(str(reference), item_key)
            problems += found
            if found:
                continue
            function, name = RewardModelScorer(str(reference)), str(reference)
        else:
            function, found = resolve_reference(reference, key=item_key)
            problems += found
            if found:
                continue
            name = str(reference)
        problem = signature_problem(function, columns)
        if problem:
            problems.append(Problem(item_key, f"{name} {problem}", fix=SIGNATURE_FIX))
            continue
        weight = 1.0 if weights is None or index >= len(weights) else weights[index]
        functions.append(RewardFunction(name, function, float(weight) if _finite(weight) else 1.0, item_key))
    return ([] if problems else functions), problems


def load_reward_functions(
    references: Sequence[Union[str, Callable[..., Any]]],
    weights: Optional[Sequence[float]] = None,
    **kwargs: Any,
) -> list[RewardFunction]:
    """The functions `resolve_reward_functions` finds; a RecipeError listing every problem."""
    functions, problems = resolve_reward_functions(references, weights, **kwargs)
    if problems:
        raise RecipeError(problems)
    return functions


def signature_problem(function: Any, columns: Optional[Sequence[str]] = None) -> Optional[str]:
    """Why `function` cannot be called as fn(prompts=..., completions=..., **columns), or None."""
    if not callable(function):
        return f"is a {type(function).__name__}, not a function"
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        return "is async (async def): reward functions are called as plain functions that return the rewards"
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: it will be called as is
        return None
    params = list(signature.parameters.values())
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        return f"has positional-only parameters ({', '.join(positional_only)}); reward functions are called by keyword"
    missing = [name for name in ("prompts", "completions") if name not in named and not var_keyword]
    if missing:
        text = f"takes no {' or '.join(repr(m) for m in missing)} argument"
        if len(params) == 2 and "completions" not in named:
            text += (
                " (it looks like the original library's reward_fn(task, completion_text): "
                "wrap it with ditty.objectives.rewards.functions.TaskReward in the Python API)"
            )
        return text
    if columns is not None:
        required = [p.name for p in named.values() if p.default is p.empty and p.name not in ("prompts", "completions")]
        absent = [name for name in required if name not in columns]
        if absent:
            return (
                f"needs the column(s) {', '.join(absent)}, which the data does not have (it has {', '.join(columns)})"
            )
    return None


def score_completions(
    functions: Sequence[RewardFunction],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: Optional[Mapping[str, Sequence[Any]]] = None,
    *,
    timeout_s: Optional[float] = None,
) -> RewardScores:
    """Every function's rewards for the completions, checked, and their weighted sum. A function
    that has not returned after `timeout_s` seconds (None or 0: no limit) is stopped."""
    import torch

    columns = dict(columns or {})
    count = len(completions)
    if len(prompts) != count or any(len(values) != count for values in columns.values()):
        raise ValueError("score_completions: prompts and every column need one entry per completion")
    clash = {"prompts", "completions"} & set(columns)
    if clash:  # each column is passed by its name, beside these two arguments
        raise RecipeError.single(
            f"the prompt rows have a column {sorted(clash)[0]!r}: reward functions take their columns as keywords, "
            "and that name is the reward functions' own argument",
            key="data",
            fix="rename the column in the data",
        )
    total = torch.zeros(count, dtype=torch.float64)
    per_function, details = {}, {}
    for function in functions:
        values, extra = _call(function, prompts, completions, columns, timeout_s)
        per_function[function.name] = torch.tensor(values, dtype=torch.float64)
        total += function.weight * per_function[function.name]
        for metric, metric_values in extra.items():
            details[f"rewards/{function.name}/{metric}"] = torch.tensor(metric_values, dtype=torch.float64)
    overflow = (~torch.isfinite(total)).nonzero()
    if len(overflow) and functions:  # each value is finite (checked), their weighted sum is not
        index = int(overflow[0])
        names = ", ".join(f.name for f in functions)
        raise _failure(
            RewardFunction(names, functions[0].function, key="rl.rewards"),
            prompts[index],
            f"is {float(total[index])} for a completion",
            "keep rewards and rl.reward_weights within a few orders of magnitude of 1",
            what_failed=f"the weighted sum of {names}",
        )
    return RewardScores(total, per_function, details)


def reward_metrics(per_function: "Mapping[str, Tensor]", details: "Optional[Mapping[str, Tensor]]" = None) -> dict:
    """rewards/NAME/mean and rewards/NAME/std (unbiased, as TRL) of each function over the whole
    gathered batch, and the mean of each extra metric a function reported."""
    import torch

    metrics = {}
    for name, values in per_function.items():
        metrics[f"rewards/{name}/mean"] = values.mean()
        metrics[f"rewards/{name}/std"] = values.std() if values.numel() > 1 else values.new_zeros(())
    for name, values in (details or {}).items():
        metrics[name] = torch.nanmean(values)
    return metrics


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the content of the last of TRL's conversational
    messages ([{"role": "assistant", "content": ...}])."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion is a string or a list of chat messages, not {type(completion).__name__}")


class TaskReward:
    """The original library's `reward_fn(task, completion_text)` as a TRL-signature function.

    `task` is the prompt row as a dict ({"prompt": ..., every other column}); the function returns
    a float, a `(reward, metrics)` pair, or a dict {"reward": ..., "metrics": {...}}; the metrics
    are logged as rewards/NAME/METRIC (means over the batch).
    """

    def __init__(self, reward_fn: Callable[[Any, str], Any], name: Optional[str] = None) -> None:
        if not callable(reward_fn):
            raise TypeError(f"TaskReward wraps a function, not a {type(reward_fn).__name__}")
        self.reward_fn = reward_fn
        self.__name__ = name or getattr(reward_fn, "__name__", type(reward_fn).__name__)
        self.last_metrics: list[dict[str, float]] = []

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Sequence[Any]) -> list[float]:
        rewards, self.last_metrics = [], []
        for index, (prompt, completion) in enumerate(zip(prompts, completions)):
            task = {"prompt": prompt, **{column: values[index] for column, values in columns.items()}}
            reward, metrics = _coerce_task_result(self.reward_fn(task, completion_text(completion)))
            rewards.append(reward)
            self.last_metrics.append(metrics)
        return rewards


def _coerce_task_result(result: Any) -> tuple[Any, dict[str, float]]:
    if isinstance(result, tuple):
        if len(result) != 2 or not isinstance(result[1], Mapping):
            raise TypeError(f"returned a tuple of {len(result)}; a tuple is (reward, {{metric: value}})")
        return result[0], {str(k): float(v) for k, v in result[1].items()}
    if isinstance(result, Mapping):
        if "reward" not in result:
            raise TypeError(f"returned a dict without a 'reward' key (keys: {', '.join(map(str, result))})")
        return result["reward"], {str(k): float(v) for k, v in (result.get("metrics") or {}).items()}
    return result, {}


def _invoke(
    function: RewardFunction,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: Mapping[str, Sequence[Any]],
    timeout_s: Optional[float],
) -> Any:
    """One call with its own copies of the arguments: a function that edits a column, a prompt or a
    chat message in place does not change what the next function (or the trainer) sees. A deep copy
    of a rollout's texts is small next to its generation."""
    arguments = copy.deepcopy({"prompts": list(prompts), "completions": list(completions), **columns})
    arguments = {name: list(values) for name, values in arguments.items()}
    with deadline(timeout_s):
        return function.function(**arguments)


def _call(
    function: RewardFunction,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]],
    timeout_s: Optional[float] = None,
) -> tuple[list[float], dict[str, list[float]]]:
    try:
        result = _invoke(function, prompts, completions, columns, timeout_s)
    except DeadlinePassed:
        raise _failure(
            function,
            prompts[0],
            f"did not return within rl.reward_timeout_s = {timeout_s:g} s",
            "find why it hangs (a network call, a lock, an endless loop), or raise rl.reward_timeout_s",
        ) from None
    except SystemExit as error:  # a checker that exits is a failing reward, not the end of the run
        culprit = _first_failing(function, prompts, completions, columns, timeout_s)
        raise _failure(
            function,
            prompts[culprit],
            f"called sys.exit({error.code!r})",
            "return 0.0 where the function cannot score a completion instead of exiting",
        ) from None
    except Exception as error:
        culprit = _first_failing(function, prompts, completions, columns, timeout_s)
        raise _failure(
            function,
            prompts[culprit],
            f"raised {type(error).__name__}: {error}",
            "fix the function, or make it return 0.0 where it cannot score a completion",
        ) from error
    if hasattr(result, "tolist") and not isinstance(result, (list, tuple)):
        result = result.tolist()  # a numpy array or a tensor
    if not isinstance(result, (list, tuple)):
        raise _failure(
            function, prompts[0], f"returned a {type(result).__name__}, not a list of numbers", SIGNATURE_FIX
        )
    if len(result) != len(completions):
        raise _failure(
            function,
            prompts[0],
            f"returned {len(result)} values for {len(completions)} completions",
            "return one reward per completion, in the order given",
        )
    values = []
    for index, value in enumerate(result):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            got = "None" if value is None else f"a {type(value).__name__} ({value!r:.40})"
            raise _failure(
                function,
                prompts[index],
                f"returned {got} for a completion",
                "return a number (0.0 where it does not apply)",
            )
        if not math.isfinite(value):
            raise _failure(
                function,
                prompts[index],
                f"returned {value} for a completion",
                "return a finite number for every completion",
            )
        values.append(float(value))
    extra: dict[str, list[float]] = {}
    reported = getattr(function.function, "last_metrics", None)
    if isinstance(reported, list) and len(reported) == len(completions):
        for metric in sorted({name for row in reported for name in row}):
            extra[metric] = [row.get(metric, math.nan) for row in reported]
    return values, extra


def _first_failing(function: RewardFunction, prompts, completions, columns, timeout_s=None) -> int:
    """The index of the first completion that makes the function raise (or exit) on its own (0 if
    none does: then it failed on the batch as a whole)."""
    for index in range(len(completions)):
        try:
            _invoke(
                function,
                [prompts[index]],
                [completions[index]],
                {name: [values[index]] for name, values in columns.items()},
                timeout_s,
            )
        except (Exception, SystemExit):
            return index
        except DeadlinePassed:  # it hangs on this one: no need to wait on the others
            return index
    return 0


def _failure(
    function: RewardFunction, prompt: Any, what: str, fix: str, *, what_failed: Optional[str] = None
) -> RewardFunctionError:
    shown = repr(prompt)
    shown = shown if len(shown) <= 200 else shown[:197] + "..."
    subject = what_failed or f"reward function {function.name}"
    return RewardFunctionError([Problem(function.key, f"{subject} {what} (prompt {shown}); the run stopped", fix=fix)])


def _callable_name(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", None)
    name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or type(function).__name__
    return f"{module}:{name}" if module and not isinstance(function, TaskReward) else name


def _finite(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value)
