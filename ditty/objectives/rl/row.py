"""The RL rows (`[rl]`: GRPO, RLOO) of the objective table: their parts, plan rows and model-card line.

The parts, each replaceable alone (a subclass of the trainer overrides `build_objective` and swaps one):
- the sampler of `rollout.backend` (ditty.objectives.sampling.sampler): `generate` on the live policy with the
  prompt cache, or a vLLM engine in the process or in a server;
- the environment (ditty.objectives.environments.protocol): the reward functions, one turn; or episodes of
  several turns (ditty.objectives.environments.episodes) in `rl.environment` or the tool environment (`rl.tools`);
- the advantage estimator `rl.advantage` names (ditty.objectives.rl.estimators): GRPO's group
  normalisation, RLOO's leave-one-out baseline, REINFORCE++'s, or the user's own;
- the assembler (ditty.objectives.rl.assembler): training micro-batches with per-token labels;
wired together by the rollout stream (ditty.objectives.rl.stream), which is the run's stream of
micro-batches; the loss is the policy loss `rl.loss` names (ditty.objectives.rl.loss), and the evaluation the
greedy reward of held-out prompts (ditty.objectives.rl.evaluation). They pass one `RolloutBatch`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable

from ditty.objectives.footprint import Footprint, reference_footprint
from ditty.objectives.parts import ObjectiveParts

if TYPE_CHECKING:
    import torch


def build_rl(run: Any) -> ObjectiveParts:
    """The parts of the RL rows (GRPO, RLOO: the estimator `rl.advantage` names)."""
    from ditty.data.build import build_stream
    from ditty.objectives.reference import build_reference
    from ditty.objectives.rewards.functions import load_reward_functions
    from ditty.objectives.rl.assembler import Assembler
    from ditty.objectives.rl.estimators import estimator_for
    from ditty.objectives.rl.loss import GRPOLoss
    from ditty.objectives.rl.stream import RolloutStream
    from ditty.objectives.sampling.policy_sampling import PolicySampling
    from ditty.objectives.sampling.sampler import build_sampler

    config, runtime = run.config, run.runtime
    rl, train = config.rl, config.train
    references = reward_references(run)
    functions = load_reward_functions(references, rl.reward_weights) if references or not rl.environment else []
    chunks = train.loss_chunks if train.loss_chunks > 0 else 8
    reference = build_reference(run, "auto", chunks=chunks, key="rl.beta") if rl.beta > 0 else None
    policy = lambda: run.engine.unwrap(run.model)  # noqa: E731  (the live, trained weights)
    pad = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
    assembler = Assembler(
        rl,
        config.rollout,
        pad_token_id=pad,
        micro_batch_size=train.micro_batch_size,
        policy_logps=scorer(run, lambda: scoring_policy(policy()), config.rollout.temperature, chunks),
        reference_logps=(
            scorer(run, reference.scoring, config.rollout.temperature, chunks) if reference is not None else None
        ),
    )
    prompts_per_step = train.global_batch_size // rl.group_size
    prompts = build_stream(
        run.data.bundle,
        config.data,
        global_batch_size=prompts_per_step,
        micro_batch_size=prompts_per_step // runtime.data_world_size,
        rank=runtime.data_rank,
        world_size=runtime.data_world_size,
    )
    sampler = build_sampler(
        run, policy, group_size=rl.group_size, tokens_after_prompt=rl.tokens_after_prompt(config.rollout)
    )
    sampling = PolicySampling(sampler, max_staleness=config.rollout.max_staleness)
    environment = build_environment(run, functions)
    guidance = None
    if rl.guidance_column:
        from ditty.objectives.rl.guidance import Guidance

        guidance = Guidance(
            rl.guidance_column, functions, run.tokenizer, config.rollout.max_new_tokens, rl.reward_timeout_s
        )
    stream = RolloutStream(
        prompts,
        sampling=sampling,
        environment=environment,
        advantage=estimator_for(rl),
        assembler=assembler,
        rl=rl,
        rank=runtime.data_rank,
        world_size=runtime.data_world_size,
        rollout=config.rollout,
        group=runtime.batch_group,
        guidance=guidance,
    )
    return ObjectiveParts(
        loss=GRPOLoss(rl, config.rollout, chunks=chunks),
        stream=stream,
        evaluation=environment.held_out(run, sampling),
        reference=reference,
        step_metrics=stream.step_metrics,
        after_update=sampling.updated,
    )


def environment_maker(environment: type, args: dict) -> Callable[[], Any]:
    """Builds one environment per episode with `rl.environment_args`; a wrapper of the original
    Ditty's environments (ditty.compat.environments.as_environment) passes them to the original."""
    if not args:
        return environment
    wrapped = getattr(environment, "original_class", None)
    if isinstance(wrapped, type):
        return lambda: environment(wrapped(**args))
    return lambda: environment(**args)


def build_environment(run: Any, functions: list) -> Any:
    """The environment part: the reward functions alone (one turn), else episodes of several turns in
    the `rl.environment` class, the built-in tool environment of `rl.tools`, or both: the environment
    offered those tools (and its own, from a `tools()` method), ditty answering every call."""
    from ditty.config.errors import RecipeError
    from ditty.config.references import import_reference
    from ditty.objectives.environments.episodes import EpisodeEnvironment
    from ditty.objectives.environments.protocol import RewardEnvironment
    from ditty.objectives.environments.rendering import ObservationRenderer
    from ditty.objectives.environments.tools.calls import call_format_for
    from ditty.objectives.environments.tools.process import ToolProcess
    from ditty.objectives.environments.tools.tool_environment import ToolEnvironment, load_tools, tool_name

    rl, tokenizer = run.config.rl, run.tokenizer
    max_prompt = run.config.data.max_seq_len
    if not rl.environment and not rl.tools:
        return RewardEnvironment(functions, rl.reward_timeout_s)
    tools = load_tools(rl.tools) if rl.tools else {}
    process = None
    if tools and rl.tools_isolation == "process":  # one worker for the run's episodes (tools/process.py)
        longest = rl.max_episode_tokens * ObservationRenderer(tokenizer, max_prompt).chars_per_token
        process = ToolProcess({tool_name(r): r for r in rl.tools}, rl.tool_timeout_s, longest)
    calls = call_format_for(getattr(tokenizer, "chat_template", None))
    if not rl.environment:
        make = lambda: ToolEnvironment(tools, calls, rl.tool_timeout_s, process)  # noqa: E731
        renderer = ObservationRenderer(tokenizer, max_prompt, tools=schemas_of(tools))
        return EpisodeEnvironment(make, "ToolEnvironment", functions, renderer, rl, run.config.rollout, key="rl.tools")
    environment = import_reference(rl.environment, key="rl.environment")
    make_environment = environment_maker(environment, rl.environment_args)
    make = make_environment
    offered = dict(tools)
    if tools or callable(getattr(environment, "tools", None)):
        own = offered_tools(make_environment, rl.environment)
        clash = sorted(set(own) & set(tools))
        if clash:
            raise RecipeError.single(
                f"names a tool {clash[0]!r} that environment {rl.environment}'s tools() offers too",
                key="rl.tools",
                fix="give every tool its own name (remove it from rl.tools, or rename the environment's)",
            )
        offered.update(own)

        def make() -> Any:
            return ToolEnvironment(tools, calls, rl.tool_timeout_s, process, environment=make_environment())

    renderer = ObservationRenderer(tokenizer, max_prompt, tools=schemas_of(offered))
    name = rl.environment.rsplit(":", 1)[-1]
    return EpisodeEnvironment(make, rl.environment, functions, renderer, rl, run.config.rollout, reward_name=name)


def schemas_of(tools: dict) -> Any:
    from ditty.objectives.environments.tools.tool_environment import tool_schemas

    return tool_schemas(tools) if tools else None


def offered_tools(make_environment: Callable[[], Any], name: str) -> dict:
    """The tools an environment offers of its own (its `tools()`), read from one instance built for
    the purpose: the chat template lists them in every episode's prompt. What fails is exit 2."""
    from ditty.config.errors import Problem, RecipeError
    from ditty.objectives.environments.tools.tool_environment import environment_tools

    try:
        return environment_tools(make_environment())
    except Exception as error:  # noqa: BLE001 - the user's constructor or tools(): reported, exit 2
        what = f"environment {name} could not offer its tools: {type(error).__name__}: {error}"
        fix = "tools() returns {name: function} of plain (def) functions or methods"
        raise RecipeError([Problem("rl.environment", what, fix=fix)]) from error


def reward_references(run: Any) -> list:
    """The reward functions: the Python API's (replacing rl.rewards), else the recipe's references."""
    given = [as_reward_function(f) for f in run.components.reward_functions or []]
    return given or list(run.config.rl.rewards)


def as_reward_function(function: Any) -> Any:
    """A Python API reward function as it is called: TRL's signature unchanged; the original
    library's reward_fn(task, completion_text) wrapped in TaskReward."""
    import inspect

    from ditty.objectives.rewards.functions import TaskReward, signature_problem

    if isinstance(function, TaskReward) or not callable(function) or signature_problem(function) is None:
        return function
    try:
        params = [p for p in inspect.signature(function).parameters.values() if p.kind != p.VAR_KEYWORD]
    except (TypeError, ValueError):
        return function
    return TaskReward(function) if len(params) == 2 else function


@contextmanager
def scoring_policy(model: "torch.nn.Module"):
    """The policy in eval mode for one scoring forward (no dropout: the sampling distribution)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def scorer(run: Any, scope: Callable[[], Any], temperature: float, chunks: int) -> Callable[[dict], "torch.Tensor"]:
    """batch -> token log-probabilities under the model `scope()` yields, by the training forward's
    path (the head input through the output head, the run's autocast, the sampling temperature)."""
    import torch

    from ditty.data.generic import to_device
    from ditty.objectives.logprobs import model_token_logps

    @torch.no_grad()
    def score(batch: dict) -> "torch.Tensor":
        inputs = to_device({k: batch[k] for k in ("input_ids", "attention_mask", "labels")}, run.runtime.device)
        with run.precision.autocast(), scope() as model:
            return model_token_logps(model, inputs, chunks=chunks, temperature=temperature)[0]

    return score


def describe_rl(config: Any) -> list[tuple[str, str]]:
    """The plan's row for [rl]: what one step samples and how it learns."""
    rl, train, rollout = config.rl, config.train, config.rollout
    prompts = train.global_batch_size // max(rl.group_size, 1)
    reference = f", KL to the reference (beta {rl.beta:g})" if rl.beta > 0 else ""
    from ditty.objectives.rl import estimators, policy_losses

    advantage = estimators.describe(rl.advantage)
    text = (
        f"{rl.kind}: {prompts} prompts x {rl.group_size} completions per step, at most {rollout.max_new_tokens} new "
        f"tokens (temperature {rollout.temperature:g}, {rollout.engine}), {advantage} advantages, "
        f"{policy_losses.describe(rl.loss)}, "
        f"{len(rl.rewards)} reward function(s){reference}"
    )
    rows = [("rl", text)]
    if rl.plays_episodes:
        where = rl.environment or f"tools {', '.join(r.rsplit(':', 1)[-1] for r in rl.tools)}"
        rows.append(
            (
                "episodes",
                f"{where}: at most {rl.max_turns} model turns and {rl.max_episode_tokens} tokens after the prompt, "
                f"{rl.credit} credit",
            )
        )
    return rows


def rl_footprint(config: Any, world_size: int) -> Footprint:
    """The rollouts' KV cache (completions in flight on a rank) and, with rl.beta > 0, the reference.
    A tensor-parallel group shares its prompts: a rank samples its data-parallel share of them."""
    rl = config.rl
    data_ranks = max(1, world_size // max(1, config.parallel.tp * config.parallel.cp))
    prompts = max(1, config.train.global_batch_size // max(1, rl.group_size) // data_ranks)
    in_flight = min(config.rollout.generation_batch_size or prompts, prompts) * rl.group_size
    return reference_footprint(
        config,
        "auto" if rl.beta > 0 else "none",
        method="rloo" if rl.advantage == "rloo" else "grpo",
        rollout_sequences=in_flight,
        rollout_tokens=config.data.max_seq_len + rl.tokens_after_prompt(config.rollout),
        chunks=config.train.loss_chunks or 8,
    )


def rl_card(config: Any) -> str:
    """What the model card's "method" adds for reinforcement learning."""
    rl = config.rl
    rewards = ", ".join(r.rsplit(":", 1)[-1] for r in rl.rewards) or "reward functions given in Python"
    kl = f", KL beta {rl.beta:g}" if rl.beta > 0 else ""
    advantage = "" if rl.advantage == "group" else f", {rl.advantage} advantages"
    settings = f"{rl.loss} loss, {rl.group_size} completions per prompt{advantage}{kl}, rewards: {rewards}"
    if rl.plays_episodes:
        where = rl.environment.rsplit(":", 1)[-1] or "tools: " + ", ".join(r.rsplit(":", 1)[-1] for r in rl.tools)
        settings += f", episodes of up to {rl.max_turns} turns ({where})"
    return f"; reinforcement learning: {rl.kind.upper()} ({settings})"
