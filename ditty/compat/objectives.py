"""The Python API's post-training objectives, through the same Trainer as `[preference]` and `[rl]`.

    Pipeline(model_factory=ModelFactory.from_huggingface("runs/sft/final"),
             dataset=[{"prompt": "2+2=", "chosen": "4", "rejected": "5"}, ...],
             preference=PreferenceConfig(kind="dpo", beta=0.1), output_dir="runs/dpo").run()

    Pipeline(model_factory=ModelFactory.from_huggingface("runs/sft/final"),
             dataset=[{"prompt": "2+2=", "answer": "4"}, ...],
             reward_fn=lambda task, text: float(text.strip() == task["answer"]),
             rl=RLConfig(group_size=8), rollout=RolloutConfig(max_new_tokens=8), output_dir="runs/grpo").run()

    Pipeline(model_factory=ModelFactory.from_huggingface("runs/student"),
             dataset=[{"prompt": "2+2=", "completion": "4"}, ...],
             distill=DistillConfig(teacher="runs/sft/final", lmbda=0.5), output_dir="runs/gkd").run()

`preference=` (a PreferenceConfig or a dict of its fields) makes the data the "preference" format
("unpaired_preference" for kto) and the loss the DPO family's, with its reference as the recipe
builds it; `loss_calculator=PreferenceLoss(config, reference=fn)` brings a reference of one's own.
`reward_fn=` (one function or a list) runs GRPO (`rl=`, an RLConfig or a dict, tunes it) on rows of
the "prompt" format; each function has TRL's signature `fn(prompts, completions, **columns)`, or the
original library's `reward_fn(task, completion_text)` returning a float, a `(reward, metrics)` pair
or a dict (ditty.objectives.rewards.functions.TaskReward). `distill=` (a DistillConfig or a dict) trains the
model as a student of its teacher (`[distill]`, kind "gkd") on prompt/completion rows or chats.
`preference=PreferenceConfig(pairs="online")` takes `rl=` (its group size) and `reward_fn=` (its
rewards) beside it, on prompt rows or preference pairs. `rollout=` (a RolloutConfig or a dict) says how
every objective that samples does (`[rollout]`); a dict given as `rl=` or `distill=` may still hold the
sampling keys that moved there (with a warning). Without an objective, a Hugging Face causal LM's rows
of text are read in the format their first row shows (`with_text_row_format`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ditty.config.errors import Problem, RecipeError


def moved_out(value: Any, key: str) -> tuple[Any, dict[str, Any]]:
    """A dict given as `key=` without the keys that moved to another section (ditty.config.aliases),
    and those keys by their new section's names ([rollout]'s); a warning names each."""
    import logging

    from ditty.config.aliases import moved_key, moved_key_message

    if not isinstance(value, dict):
        return value, {}
    kept, moved = {}, {}
    for name, item in value.items():
        new = moved_key(f"{key}.{name}")
        if new is None:
            kept[name] = item
            continue
        moved[new.split(".", 1)[1]] = item
        message, fix = moved_key_message(f"{key}.{name}", new)
        logging.getLogger("ditty").warning("%s= %r %s (%s)", key, name, message, fix)
    return kept, moved


def with_current_keys(extra_config: Any) -> dict:
    """`extra_config` ({section: {field: value}}, as a recipe's tables) with keys that moved under their
    current names (ditty.config.aliases), each named in a warning."""
    import copy
    import logging

    from ditty.config.aliases import move_keys, moved_key_message

    tables = copy.deepcopy(dict(extra_config or {}))
    moved, clashes = move_keys(tables)
    if clashes:
        old, new = clashes[0]
        raise RecipeError.single(f"extra_config gives {old} and {new}, one key by its old and new names", key=old)
    for new, old in moved.items():
        message, fix = moved_key_message(old, new)
        logging.getLogger("ditty").warning("extra_config: %s %s (%s)", old, message, fix)
    return tables


def as_section(value: Any, section: type, key: str) -> Any:
    """`value` as the recipe section `section`: an instance, or a dict of its fields."""
    if isinstance(value, section):
        return value
    if isinstance(value, dict):
        names = {f.name for f in dataclasses.fields(section)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise RecipeError.single(
                f"{key}= has no field(s) {', '.join(unknown)}",
                key=key,
                fix=f"use the fields of {section.__name__}: {', '.join(sorted(names))}",
            )
        return section(**value)
    raise RecipeError.single(
        f"{key}= takes a {section.__name__} or a dict of its fields, not a {type(value).__name__}",
        key=key,
        fix=f"pass {key}={section.__name__}(...)",
    )


def reward_function_problems(functions: list, config: Any) -> list[Problem]:
    """`reward_fn=` checked as the run will load it, with rl.reward_weights (one per function)."""
    if not functions:
        return []
    from ditty.objectives.rewards.functions import resolve_reward_functions
    from ditty.objectives.rl.row import as_reward_function

    given = [as_reward_function(f) for f in functions]  # as the run calls them
    return resolve_reward_functions(given, config.rl.reward_weights, key="reward_fn")[1]


def reward_function_list(reward_fn: Any) -> Optional[list]:
    """The reward functions `reward_fn=` names (one callable or a list of them), or None."""
    if reward_fn is None:
        return None
    functions = list(reward_fn) if isinstance(reward_fn, (list, tuple)) else [reward_fn]
    bad = [type(f).__name__ for f in functions if not callable(f)]
    if bad or not functions:
        raise RecipeError.single(
            f"reward_fn= takes functions, got {', '.join(bad) or 'an empty list'}",
            key="reward_fn",
            fix="pass reward_fn=fn with fn(task, completion_text) -> float, or fn(prompts, completions, **columns)",
        )
    return functions


def with_objective(
    config: Any,
    preference: Any = None,
    rl: Any = None,
    reward_fn: Any = None,
    loss_calculator: Any = None,
    distill: Any = None,
    first_row: Any = None,
    rollout: Any = None,
) -> Any:
    """`config` with the `[preference]`, `[rl]` or `[distill]` section the keywords ask for, and the
    data format it reads (for online pairs, that of `first_row`: prompts, or pairs); `rollout=`'s
    [rollout], with the sampling keys a dict `rl=` or `distill=` still holds."""
    from ditty.config.preference import PreferenceConfig
    from ditty.config.rl import RLConfig
    from ditty.config.rollout import RolloutConfig

    rl, from_rl = moved_out(rl, "rl")
    distill, from_distill = moved_out(distill, "distill")
    if rollout is not None or from_rl or from_distill:
        section = as_section(rollout if rollout is not None else {}, RolloutConfig, "rollout")
        config = dataclasses.replace(config, rollout=dataclasses.replace(section, **{**from_distill, **from_rl}))

    if distill is not None:
        return _with_distill(config, distill, preference, rl, reward_fn, loss_calculator, first_row)
    if preference is not None and _online(preference):
        return _with_online_pairs(config, preference, rl, loss_calculator, first_row)
    reinforcement = rl is not None or reward_fn is not None
    if reinforcement:
        _refuse_a_loss_beside(
            loss_calculator,
            "rl=/reward_fn= train with GRPO's policy loss",
            "leave loss_calculator out (rl=RLConfig(...) tunes GRPO's loss), or leave out rl=/reward_fn=",
        )
    if preference is not None and reinforcement:
        raise RecipeError.single(
            "preference= and rl=/reward_fn= are two objectives; a run trains one",
            key="preference",
            fix="run preference optimisation and reinforcement learning as two Pipelines, one after the other",
        )
    if preference is not None:
        from ditty.objectives.preference_loss import PreferenceLoss

        if not isinstance(loss_calculator, PreferenceLoss):
            _refuse_a_loss_beside(
                loss_calculator,
                "preference= trains with its kind's preference loss",
                "leave loss_calculator out (preference=PreferenceConfig(...) tunes the loss), or pass a PreferenceLoss",
            )
        section = as_section(preference, PreferenceConfig, "preference")
        data_format = "unpaired_preference" if section.kind == "kto" else "preference"
        return dataclasses.replace(
            config, preference=section, data=dataclasses.replace(config.data, format=data_format)
        )
    if reinforcement:
        section = as_section(rl if rl is not None else {}, RLConfig, "rl")
        if section.kind == "none":
            section = dataclasses.replace(section, kind="grpo")
        if not isinstance(section.environment, str):  # a class or an instance: named by a reference
            from ditty.compat.given_environments import environment_reference

            section = dataclasses.replace(section, environment=environment_reference(section.environment))
        return dataclasses.replace(config, rl=section, data=dataclasses.replace(config.data, format="prompt"))
    return config


def _refuse_a_loss_beside(loss_calculator: Any, objective_loss: str, fix: str) -> None:
    """An objective's own loss would replace a loss_calculator= given beside it without a word."""
    if loss_calculator is not None:
        raise RecipeError.single(
            f"{objective_loss}, which would replace loss_calculator={type(loss_calculator).__name__}",
            key="loss_calculator",
            fix=fix,
        )


def _online(preference: Any) -> bool:
    pairs = preference.get("pairs") if isinstance(preference, dict) else getattr(preference, "pairs", None)
    return pairs == "online"


def _with_online_pairs(config: Any, preference: Any, rl: Any, loss_calculator: Any, first_row: Any) -> Any:
    """Online preference pairs: `rl=` holds their sampler settings and `reward_fn=` their rewards (as
    `[rl]` does for the recipe's `pairs = "online"`); the rows are prompts, or pairs whose prompts
    are sampled (the format of the first row, when it can be read)."""
    from ditty.config.preference import PreferenceConfig
    from ditty.config.rl import RLConfig

    _refuse_a_loss_beside(
        loss_calculator,
        "online pairs train with the preference loss of preference=",
        "leave loss_calculator out (preference=PreferenceConfig(...) tunes the loss)",
    )
    section = as_section(preference, PreferenceConfig, "preference")
    sampler = as_section(rl if rl is not None else {}, RLConfig, "rl")
    prompts_only = isinstance(first_row, dict) and "chosen" not in first_row
    data = dataclasses.replace(config.data, format="prompt" if prompts_only else "preference")
    return dataclasses.replace(config, preference=section, rl=sampler, data=data)


def _with_distill(
    config: Any, distill: Any, preference: Any, rl: Any, reward_fn: Any, loss_calculator: Any, first_row: Any
) -> Any:
    """`config` with the `[distill]` section `distill=` gives (kind "gkd" unless it names another), on
    prompt/completion rows, or on chats when the first row holds messages and no prompt."""
    from ditty.config.distill import DistillConfig

    others = [
        name for name, value in (("preference", preference), ("rl", rl), ("reward_fn", reward_fn)) if value is not None
    ]
    if others:
        raise RecipeError.single(
            f"distill= and {'/'.join(f'{name}=' for name in others)} are two objectives; a run trains one",
            key="distill",
            fix="run them as two Pipelines, one after the other",
        )
    _refuse_a_loss_beside(
        loss_calculator,
        "distill= trains with the generalised JSD to its teacher",
        "leave loss_calculator out (distill=DistillConfig(...) tunes the divergence), or leave out distill=",
    )
    section = as_section(distill, DistillConfig, "distill")
    if section.kind == "none":
        section = dataclasses.replace(section, kind="gkd")
    data = config.data
    if isinstance(first_row, dict) and data.messages_column in first_row and data.prompt_column not in first_row:
        data = dataclasses.replace(data, format="chat")
    return dataclasses.replace(config, distill=section, data=data)


def with_text_row_format(config: Any, data: Any, preprocessors: list, tokenizer: Any) -> Any:
    """A supervised causal LM's rows of text (prompt/completion, text or messages), which the Trainer
    tokenizes (ditty.train.data_modes.takes_rows), read in the format their first row shows."""
    from ditty.models.tasks import model_task
    from ditty.train.data_modes import first_row, text_row_format

    if objective_row(config) or not model_task(config.model.task).token_rows or preprocessors:
        return config
    if tokenizer is None and not (config.model.path or config.tokenizer.path):
        return config
    found = text_row_format(first_row(data), config.data)
    if found is None or found == config.data.format:
        return config
    return dataclasses.replace(config, data=dataclasses.replace(config.data, format=found))


def objective_loss(config: Any) -> str:
    """The loss an objective's row trains, as its model-card line says it ("reinforcement learning:
    GRPO (dapo loss, ...)"); the task's default loss for the supervised row."""
    from ditty.objectives.table import objective_for

    return objective_for(config).card(config).lstrip("; ") or "the default CausalLMLoss"


def objective_row(config: Any) -> bool:
    """Whether the run trains an objective with its own loss (the keywords' or extra_config's section
    chose its row of ditty.objectives.table), not the model task's."""
    from ditty.objectives.table import objective_name

    return objective_name(config) not in ("supervised", "reward-model")
