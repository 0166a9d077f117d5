"""The Python API's post-training objectives, through the same Trainer as `[preference]` and `[rl]`.

    Pipeline(model_factory=ModelFactory.from_huggingface("runs/sft/final"),
             dataset=[{"prompt": "2+2=", "chosen": "4", "rejected": "5"}, ...],
             preference=PreferenceConfig(kind="dpo", beta=0.1), output_dir="runs/dpo").run()

    Pipeline(model_factory=ModelFactory.from_huggingface("runs/sft/final"),
             dataset=[{"prompt": "2+2=", "answer": "4"}, ...],
             reward_fn=lambda task, text: float(text.strip() == task["answer"]),
             rl=RLConfig(group_size=8, max_new_tokens=8), output_dir="runs/grpo").run()

`preference=` (a PreferenceConfig or a dict of its fields) makes the data the "preference" format
("unpaired_preference" for kto) and the loss the DPO family's, with its reference as the recipe
builds it; `loss_calculator=PreferenceLoss(config, reference=fn)` brings a reference of one's own.
`reward_fn=` (one function or a list) runs GRPO (`rl=`, an RLConfig or a dict, tunes it) on rows of
the "prompt" format; each function has TRL's signature `fn(prompts, completions, **columns)`, or the
original library's `reward_fn(task, completion_text)` returning a float, a `(reward, metrics)` pair
or a dict (ditty.objectives.rewards.TaskReward).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ditty.config.errors import RecipeError


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
    config: Any, preference: Any = None, rl: Any = None, reward_fn: Any = None, loss_calculator: Any = None
) -> Any:
    """`config` with the `[preference]` or `[rl]` section the keywords ask for, and the data format it reads."""
    from ditty.config.preference import PreferenceConfig
    from ditty.config.rl import RLConfig

    reinforcement = rl is not None or reward_fn is not None
    if reinforcement and loss_calculator is not None:
        raise RecipeError.single(
            f"rl=/reward_fn= train with GRPO's policy loss, which would replace loss_calculator="
            f"{type(loss_calculator).__name__}",
            key="loss_calculator",
            fix="leave loss_calculator out (rl=RLConfig(...) tunes GRPO's loss), or leave out rl=/reward_fn=",
        )
    if preference is not None and reinforcement:
        raise RecipeError.single(
            "preference= and rl=/reward_fn= are two objectives; a run trains one",
            key="preference",
            fix="run preference optimisation and reinforcement learning as two Pipelines, one after the other",
        )
    if preference is not None:
        section = as_section(preference, PreferenceConfig, "preference")
        data_format = "unpaired_preference" if section.kind == "kto" else "preference"
        return dataclasses.replace(
            config, preference=section, data=dataclasses.replace(config.data, format=data_format)
        )
    if reinforcement:
        section = as_section(rl if rl is not None else {}, RLConfig, "rl")
        if section.kind == "none":
            section = dataclasses.replace(section, kind="grpo")
        return dataclasses.replace(config, rl=section, data=dataclasses.replace(config.data, format="prompt"))
    return config


def trains_objective(preference: Any, rl: Any, reward_fn: Any) -> bool:
    """Whether the loss is the objective's (built by the Trainer), not the causal-LM default."""
    return preference is not None or rl is not None or reward_fn is not None
