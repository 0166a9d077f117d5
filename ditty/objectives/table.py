"""Training objectives as rows of one table, like `TASKS` (ditty.models.tasks) and torchtitan's TrainSpec.

A row says everything ditty needs to know about one objective, each as a callable so that the
compiler can read the table without importing torch:

- `build(run) -> ObjectiveParts`: the parts the trainer's `build_objective` step builds from the
  typed run (ditty.train.state.TrainRun): the loss, and where the objective needs them its own
  stream of micro-batches (rollouts), its evaluation and its reference model;
- `rules(ctx)`: the compiler's checks of the sections it reads (each a `Problem` with a key and a fix);
- `describe(config)`: the rows `ditty check` prints for it, and `footprint(config, world_size)`: what
  the memory planner adds to a rank beyond the policy (ditty.plan.objective);
- `card(config)`: what the model card's "method" line adds.

Which row a recipe trains is decided here, in `objective_choice`, from the sections that name a choice
(`[rl] kind` and `advantage`, `[distill] kind`, `[preference] kind` and `pairs`, `[model] task`); the
compiler runs the chosen row's rules (ditty.recipe.objective_rules) and warns about set keys of the
sections only other rows read. Adding an objective is one module with its builder (and its rules,
plan and card), one row below, and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ditty.config.errors import Problem


def _lazy(module: str, name: str) -> Callable:
    """`module.name`, imported at the first call: the table stays cheap to import."""

    def call(*args: Any, **kwargs: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}:{name}"
    return call


def _no_rules(ctx: Any) -> Iterator[Problem]:
    return iter(())


def _nothing(config: Any) -> Any:
    return []


@dataclass(frozen=True)
class Objective:
    name: str
    """The row's name (what `ditty check` and the model card call it)."""
    summary: str
    """One line: what it trains, for `ditty check` and the docs."""
    data_formats: tuple[str, ...]
    """The `data.format` values it reads (empty: whatever the model task reads). A row with sections of
    its own is held to them by the compiler (ditty.recipe.objective_rules), in the words of `reads`."""
    sections: tuple[str, ...]
    """The recipe sections it reads beyond the core ones; a set key of another row's section has no effect."""
    build: Callable[[Any], Any]
    """(run) -> ObjectiveParts (ditty.objectives.parts)."""
    rules: Callable[[Any], Iterator[Problem]] = _no_rules
    """The compiler's checks when this row is chosen: (ctx) -> Problems (ditty.recipe.rule_base.Context)."""
    describe: Callable[[Any], list] = _nothing
    """(config) -> [(label, text)] rows of `ditty check`'s plan."""
    footprint: Callable[[Any, int], Any] = field(default=None)  # type: ignore[assignment]
    """(config, world_size) -> ditty.objectives.reference.Footprint: what the planner adds; None: nothing."""
    card: Callable[[Any], str] = lambda config: ""
    """(config) -> what the model card's "method" adds ("" for none)."""
    given_loss: bool = False
    """A loss the recipe or the Python API names ([[pipeline.loss]], loss_calculator=) takes the place of
    the row's loss, and the row builds nothing else; False: such a loss is refused."""
    reads: str = ""
    """Why it reads those formats, in a few words, for the compiler's message."""
    post_training: bool = True
    """A stage after SFT, read against where it started: by default it is evaluated at step 0
    (`train.eval_at_start`) and by greedy exact match where its data has answers (`data.val_exact_match`)."""


SUPERVISED = Objective(
    name="supervised",
    summary="the model task's own loss on its data (causal LM SFT, classification, seq2seq, ...)",
    data_formats=(),
    sections=(),
    build=_lazy("ditty.objectives.supervised", "build_supervised"),
    rules=_lazy("ditty.objectives.supervised", "supervised_rules"),
    given_loss=True,
    post_training=False,
)

REWARD_MODEL = Objective(
    name="reward-model",
    summary='a Bradley-Terry scorer of preference pairs (model.task = "reward-model")',
    data_formats=("preference",),
    sections=(),
    build=_lazy("ditty.objectives.supervised", "build_supervised"),
    card=_lazy("ditty.objectives.supervised", "reward_model_card"),
    given_loss=True,
)


def _pairs_row(kind: str, summary: str, data_format: str = "preference") -> Objective:
    return Objective(
        name=kind,
        summary=summary,
        data_formats=(data_format,),
        reads="unpaired examples: prompt, completion, label" if data_format != "preference" else "preference pairs",
        sections=("preference",),
        build=_lazy("ditty.objectives.pairs", "build_pairs"),
        rules=_lazy("ditty.objectives.pairs", "pair_rules"),
        describe=_lazy("ditty.objectives.pairs", "describe_pairs"),
        footprint=_lazy("ditty.objectives.pairs", "pairs_footprint"),
        card=_lazy("ditty.objectives.pairs", "pairs_card"),
        given_loss=True,  # the Python API's PreferenceLoss(config, reference=fn)
    )


def _rl_row(name: str, summary: str, build: Callable[[Any], Any]) -> Objective:
    return Objective(
        name=name,
        summary=summary,
        data_formats=("prompt",),
        reads="it samples its own completions: a `prompt` column; other columns go to the reward functions",
        sections=("rl", "rollout"),
        build=build,
        rules=_lazy("ditty.objectives.rl.rl_rules", "rl_rules"),
        describe=_lazy("ditty.objectives.rl.row", "describe_rl"),
        footprint=_lazy("ditty.objectives.rl.row", "rl_footprint"),
        card=_lazy("ditty.objectives.rl.row", "rl_card"),
    )


OBJECTIVES: dict[str, Objective] = {
    row.name: row
    for row in (
        SUPERVISED,
        REWARD_MODEL,
        _pairs_row("dpo", "DPO on preference pairs (Rafailov et al. 2023)"),
        _pairs_row("ipo", "IPO on preference pairs (Azar et al. 2023)"),
        _pairs_row("simpo", "SimPO on preference pairs, reference-free (Meng et al. 2024)"),
        _pairs_row("orpo", "ORPO on preference pairs, reference-free (Hong et al. 2024)"),
        _pairs_row("kto", "KTO on unpaired examples (Ethayarajh et al. 2024)", "unpaired_preference"),
        _rl_row(
            "grpo",
            "GRPO: sampled groups of completions, rewards, group-normalised advantages",
            _lazy("ditty.objectives.rl.row", "build_rl"),
        ),
        _rl_row(
            "rloo",
            'RLOO: GRPO\'s rollouts and policy loss with a leave-one-out baseline (rl.advantage = "rloo")',
            _lazy("ditty.objectives.rl.rloo", "build_rloo"),
        ),
        Objective(
            name="online-pairs",
            summary="preference optimisation on pairs the policy samples: the best and worst of each group",
            data_formats=("prompt", "preference"),
            reads="pairs are sampled from prompts, or from the prompts of preference pairs",
            sections=("preference", "rl", "rollout"),
            build=_lazy("ditty.objectives.online_pairs", "build_online_pairs"),
            rules=_lazy("ditty.objectives.online_pairs_rules", "online_rules"),
            describe=_lazy("ditty.objectives.online_pairs", "describe_online"),
            footprint=_lazy("ditty.objectives.online_pairs", "online_footprint"),
            card=_lazy("ditty.objectives.online_pairs", "online_card"),
        ),
        Objective(
            name="gkd",
            summary="on-policy distillation from a teacher: the generalised JSD on the student's own samples",
            data_formats=("prompt_completion", "chat"),
            reads="distillation reads prompts and completions",
            sections=("distill", "rollout"),
            build=_lazy("ditty.objectives.gkd", "build_distill"),
            rules=_lazy("ditty.objectives.gkd", "distill_rules"),
            describe=_lazy("ditty.objectives.gkd", "describe_distill"),
            footprint=_lazy("ditty.objectives.gkd", "distill_footprint"),
            card=_lazy("ditty.objectives.gkd", "distill_card"),
        ),
    )
}

PAIR_FORMATS = ("preference", "unpaired_preference")


def objective_choice(config: Any) -> tuple[str, str]:
    """(the row a recipe trains, the recipe key that chose it); see the module doc. Explicit choices
    first: `[rl] kind` (RLOO with `advantage = "rloo"`, else GRPO), `[distill] kind`, then `[model] task`
    ("reward-model"), then a causal LM with `[preference] pairs = "online"` (pairs sampled from
    prompts) or on preference data (`[preference] kind`); everything else trains the task's own loss."""
    if config.rl.kind != "none":  # RLOO has a row of its own; every other estimator is GRPO's row's part
        return ("rloo", "rl.advantage") if config.rl.advantage == "rloo" else ("grpo", "rl.kind")
    if config.distill.kind != "none":
        return config.distill.kind, "distill.kind"
    task = config.model.task
    if task == "reward-model":
        return "reward-model", "model.task"
    if task == "causal-lm" and config.preference.pairs == "online":
        return "online-pairs", "preference.pairs"
    if task == "causal-lm" and config.data.format in PAIR_FORMATS:
        return config.preference.kind, "preference.kind"
    return "supervised", "model.task"


def objective_name(config: Any) -> str:
    return objective_choice(config)[0]


def objective_for(config: Any) -> Objective:
    """The row of `objective_name(config)`; the compiler has refused a name without a row."""
    return OBJECTIVES[objective_name(config)]
