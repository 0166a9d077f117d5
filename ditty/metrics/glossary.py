"""Every key a run can write to metrics.jsonl: what it means, its unit and when it appears.

One registry, read three ways: docs/metrics.md is rendered from it at build time (the docs hook
tools/docs_tables.py), `defines(key)` says whether a key is documented (a test runs short runs and
fails on a key the registry lacks), and `lookup(key)` gives the entry of a key.

A key may hold a placeholder in capitals: NAME (a reward function, data source, tool, environment
metric or held-out set: any text, slashes included), K (a head's number from 1), TASK and METRIC
(an lm-evaluation-harness task and its score). `rewards/NAME/mean` defines
`rewards/ditty.objectives.rewards.builtin_rewards:exact_match/mean`. Entries with `named_by_user` are keys
whose whole name your own code chooses (a loss part, an evaluation hook's score): they are
documented, but they define no key, so a typo in a built-in name cannot hide behind them.

Plain data: importing it loads nothing else of ditty.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Metric:
    key: str
    """The key in metrics.jsonl, with placeholders in capitals (NAME, K, TASK, METRIC)."""
    meaning: str
    unit: str
    when: str
    """Which runs log it, and on which records."""
    group: str
    named_by_user: bool = False


PLACEHOLDERS = {"NAME": ".+", "K": "[1-9][0-9]*", "TASK": "[^/]+", "METRIC": "[^/]+"}
"""What each placeholder stands for, as a regular expression."""

# when-tokens the entries below use
WHEN = {
    "{LOGGED}": "records of `train.log_every` steps",
    "{EVAL}": "evaluation records (`train.eval_every`; step 0 with `train.eval_at_start`)",
    "{RL_STEP}": "RL runs (`[rl]`), records of `train.log_every` steps",
    "{PAIRS}": "DPO-family runs (`[preference]`) and reward models, records of `train.log_every` steps",
}
YOURS = "Keys your own code names"
"""The group of the keys whose whole name your code chooses (`named_by_user`)."""

# One entry: `KEY | UNIT | WHEN`, then its meaning on the indented lines below; `## GROUP` starts a
# group (a table of docs/metrics.md, in this order).
_ENTRIES = """
## Every logged step
step | steps | every record
    The optimizer step the record belongs to (0: the evaluation before the first step).
loss | objective's | {LOGGED}
    The training loss: the objective's loss over the whole global batch, averaged over the steps since the last
    record. Its unit is the objective's: mean token cross-entropy for SFT, mean pair loss for the DPO family,
    the clipped surrogate for GRPO.
lr | learning rate | {LOGGED}
    The learning rate the logged step used (the first parameter group's).
grad_norm | L2 norm | {LOGGED}
    The global L2 norm of the gradients before clipping (`train.max_grad_norm`), averaged over the steps since
    the last record.
tokens | tokens | {LOGGED}
    Non-padding tokens that entered the model since the run began, all ranks together (samples for data that is
    not text).
tokens_per_s | tokens/s | {LOGGED}
    `tokens` per wall-clock second over the interval since the last record, all ranks together.
elapsed_s | s | {LOGGED}
    Wall-clock seconds since the run began (a resumed run continues its checkpoint's clock).
peak_mem_mb | MiB | {LOGGED}
    Peak memory of the busiest rank so far: CUDA memory allocated by tensors on a GPU, the process's peak
    resident set on a CPU.
mfu | fraction of peak | {LOGGED}
    Model FLOPs utilisation: the model's FLOPs per token times `tokens_per_s`, over the devices' peak FLOP/s at
    the run's precision. Null where the peak is unknown (set `logging.peak_tflops`).
hfu | fraction of peak | {LOGGED}
    Hardware FLOPs utilisation: `mfu` plus the forward that activation checkpointing recomputes.
## Steps, in some runs
skipped | boolean | the record of a skipped step
    True on the record of a step that was skipped (a non-finite loss or gradient norm): the weights did not
    change.
skip_reason | text | the record of a skipped step
    Why the step was skipped (a non-finite loss or gradient norm).
step_loss | objective's | the record of a skipped step
    The skipped step's own loss (`loss` averages the finite steps only).
step_grad_norm | L2 norm | the record of a skipped step
    The skipped step's own gradient norm.
loss_scale | factor | `train.precision = "fp16"`, {LOGGED}
    The dynamic loss scale of fp16 training at the logged step.
skipped_rows | rows | once a row was skipped, {LOGGED}
    Bad data rows left out so far (`data.on_bad_rows = "skip"`), all ranks and readers together.
tokens/source/NAME | tokens | mixtures (`[[data.sources]]`), {LOGGED}
    Tokens drawn so far from the source NAME of a mixture (its `name`, else its index in `[[data.sources]]`).
## Evaluation
val_loss | objective's | {EVAL}
    The training loss on the held-out set (every held-out row; the DPO family: every held-out pair).
val_loss/NAME | objective's | mixtures with a held-out set per source, {EVAL}
    `val_loss` on the held-out set of the source NAME alone.
val_perplexity | perplexity | causal and masked LMs, {EVAL}
    exp(`val_loss`) of a token-level loss.
val_exact_match | fraction | data with reference answers (`data.val_exact_match`), {EVAL}
    Share of the first `train.eval_samples` held-out rows whose greedy answer equals the reference answer
    exactly (a completion, a chat's last assistant turn, a pair's chosen answer, a prompt row's `answer`).
val_accuracy | fraction | classification and reward-model runs, {EVAL}
    Share of held-out rows classified right; for a reward model, of held-out pairs whose chosen completion
    scores above the rejected one.
val_f1 | fraction | sequence and token classification, {EVAL}
    Macro-averaged F1 of the held-out labels.
val_nn_distance | pixel L2 | `digits_diffusion`, {EVAL}
    Mean L2 distance from each generated digit image to the nearest real one (lower is closer to the data).
val_classes | classes | `digits_diffusion`, {EVAL}
    How many of the 10 digit classes the generated samples cover (each at least 2% of them).
## Preference optimisation and reward models
rewards/chosen | reward (nats x beta; scores) | {PAIRS}
    DPO family: the implicit reward of the chosen completions, beta x (policy - reference log-probability);
    SimPO and ORPO: beta x the mean token log-probability; KTO: of the desirable examples. Reward models: the
    mean score of the chosen completions.
rewards/rejected | reward | {PAIRS}
    As `rewards/chosen`, for the rejected completions (KTO: the undesirable examples).
rewards/margins | reward | {PAIRS}
    The mean of chosen minus rejected reward over the pairs.
rewards/accuracies | fraction | {PAIRS} (not KTO)
    Share of pairs whose chosen reward is above the rejected one.
logps/chosen | nats | DPO-family runs, {LOGGED}
    The policy's log-probability of the chosen completion, summed over its tokens (SimPO and ORPO: averaged over
    them).
logps/rejected | nats | DPO-family runs, {LOGGED}
    As `logps/chosen`, for the rejected completion.
nll_loss | nats per token | ORPO, and DPO/IPO with `sft_weight` > 0, {LOGGED}
    The chosen completion's negative log-likelihood per token, averaged over the pairs: the SFT term of ORPO,
    and of DPO or IPO with `preference.sft_weight` above 0.
log_odds_ratio | nats | ORPO, {LOGGED}
    ORPO's log sigmoid of the log odds ratio of chosen over rejected, averaged over the pairs.
log_odds_chosen | nats | ORPO, {LOGGED}
    ORPO's log odds ratio of the chosen over the rejected completion, averaged over the pairs.
kl | nats | KTO, and RL with `rl.beta` > 0, {LOGGED}
    KTO: the reference point z, the batch's estimate of KL(policy || reference) (clamped at 0). GRPO with
    `rl.beta` > 0: the mean k3 estimate of KL(policy || reference) per completion token.
val_rewards/chosen | reward | DPO-family and reward-model runs, {EVAL}
    `rewards/chosen` over the held-out pairs (likewise `val_rewards/rejected`, `val_rewards/margins`,
    `val_rewards/accuracies`).
val_rewards/rejected | reward | DPO-family and reward-model runs, {EVAL}
    `rewards/rejected` over the held-out pairs.
val_rewards/margins | reward | DPO-family and reward-model runs, {EVAL}
    `rewards/margins` over the held-out pairs.
val_rewards/accuracies | fraction | DPO-family and reward-model runs, {EVAL}
    `rewards/accuracies` over the held-out pairs.
val_logps/chosen | nats | DPO-family runs, {EVAL}
    `logps/chosen` over the held-out pairs.
val_logps/rejected | nats | DPO-family runs, {EVAL}
    `logps/rejected` over the held-out pairs.
val_nll_loss | nats per token | as `nll_loss`, {EVAL}
    `nll_loss` over the held-out pairs.
val_log_odds_ratio | nats | ORPO, {EVAL}
    `log_odds_ratio` over the held-out pairs.
val_log_odds_chosen | nats | ORPO, {EVAL}
    `log_odds_chosen` over the held-out pairs.
val_kl | nats | KTO, {EVAL}
    KTO's `kl` over the held-out examples.
## Reinforcement learning (GRPO, RLOO)
reward | reward | {RL_STEP}
    The mean total reward (the weighted sum of `rl.rewards`, plus an environment's) of the step's completions,
    all ranks together.
reward_std | reward | {RL_STEP}
    The standard deviation (unbiased) of the step's total rewards over the whole batch.
frac_reward_zero_std | fraction of groups | {RL_STEP}
    Share of the step's groups whose completions all earned the same reward: their advantage is 0 and they teach
    nothing.
rewards/NAME/mean | reward | {RL_STEP}
    The mean of reward NAME (a function's `package.module:function`, a reward model's path, an environment's
    reward component) over the step's completions, before `rl.reward_weights`.
rewards/NAME/std | reward | {RL_STEP}
    The standard deviation (unbiased) of reward NAME over the step's completions.
rewards/NAME/METRIC | the function's | reward functions that report extra scores, {LOGGED}
    The mean of a score reward function NAME reports beside its rewards.
completions/mean_length | tokens | {RL_STEP}
    The mean number of tokens the policy wrote per completion (per episode: the model's and the environment's
    tokens after the prompt).
completions/max_length | tokens | {RL_STEP}
    The longest completion of the step.
completions/clipped_ratio | fraction | {RL_STEP}; online pairs from prompts without reference answers
    Share of completions cut at `rollout.max_new_tokens` (or an episode's budget) before they ended. Most of
    them over the first three rollouts is a warning naming the budget to raise.
clip_ratio/low_mean | fraction | {RL_STEP}
    Share of completion tokens (`rl.importance = "sequence"`: of completions) whose importance ratio fell below
    1 - `rl.clip_low` with a negative advantage: clipped from below.
clip_ratio/high_mean | fraction | {RL_STEP}
    Share of tokens (or completions) whose ratio rose above 1 + `rl.clip_high` with a positive advantage:
    clipped from above.
clip_ratio/region_mean | fraction | {RL_STEP}
    Share of tokens (or completions) clipped either way.
rollout/generate_s | s | {RL_STEP}
    Seconds rank 0 spent sampling the step's completions (a step that reuses rollouts, `rl.updates_per_rollout`
    > 1, repeats their figure).
rollout/tokens_per_s | tokens/s | {RL_STEP}
    Completion tokens sampled per second of sampling, all ranks together (timed by the slowest rank).
rollout/generation_share | fraction | {RL_STEP} (from the second step)
    Sampling's share of the wall time between two steps: near 1, the step waits on the sampler.
rollout/guided_share | fraction | `rl.guidance_column`, {RL_STEP}
    Share of the step's groups that sampled nothing as good as the data's answer and trained on that answer in
    place of their last completion (ditty.objectives.rl.guidance).
rollout/sampled_reward | reward | `rl.guidance_column`, {RL_STEP}
    The mean total reward of the completions the policy sampled: `reward` without the answers put in.
rollout/staleness | updates | vLLM backends and `rollout.max_staleness` > 0, {LOGGED}
    How many optimizer updates behind the policy the sampler's weights were when it sampled the step's
    completions (0: on-policy; 1 under `rollout.max_staleness = 1`).
rollout/logprob_diff/mean | nats | samplers that report log-probabilities (vLLM backends), {LOGGED}
    The mean over completion tokens of |log pi_trainer - log pi_sampler|: how far the sampler's numbers are from
    the trainer's (about 1e-6 in fp32 with the same weights).
rollout/logprob_diff/max | nats | as `rollout/logprob_diff/mean`
    The largest |log pi_trainer - log pi_sampler| of the step's completion tokens.
val_reward | reward | RL runs and online pairs on prompt rows, {EVAL}
    The mean total reward of greedy completions (or greedy episodes) of the first `train.eval_samples` held-out
    prompts.
val_reward/NAME | reward | RL runs with two or more rewards, {EVAL}
    `val_reward` of reward NAME alone (unweighted).
## Episodes: tools and environments
env/turns | turns | episode runs (`rl.tools`, `rl.environment`), {LOGGED}
    Model turns per episode (mean over the step's episodes).
env/episode_tokens | tokens | episode runs, {LOGGED}
    Tokens an episode added after its prompt, the model's and the environment's together (mean).
env/truncated | fraction | episode runs, {LOGGED}
    Share of episodes cut at `rl.max_turns` or `rl.max_episode_tokens`.
env/observations_cut | observations | episode runs, {LOGGED}
    Observations (a tool's answer too) cut to the room left in the episode, per episode (mean).
env/tool_calls | calls | runs with `rl.tools`, {LOGGED}
    Tool calls per episode, well formed or not (mean).
env/tool_calls/NAME | calls | runs with `rl.tools`, {LOGGED}
    Calls of the tool NAME per episode (mean).
env/tool_errors | calls | runs with `rl.tools`, {LOGGED}
    Tool calls per episode answered with an error (mean): the sum of the four kinds below.
env/tool_errors/malformed | calls | runs with `rl.tools`, {LOGGED}
    Calls per episode whose text did not parse as a call.
env/tool_errors/unknown | calls | runs with `rl.tools`, {LOGGED}
    Calls per episode of a tool that `rl.tools` does not name.
env/tool_errors/raised | calls | runs with `rl.tools`, {LOGGED}
    Calls per episode whose tool raised (or returned what cannot be made text).
env/tool_errors/timeout | calls | runs with `rl.tools`, {LOGGED}
    Calls per episode still running after `rl.tool_timeout_s`.
env/NAME | yours | runs with `rl.environment`, {LOGGED}
    A metric your environment's `step` reports in `StepResult.metrics`, summed over an episode's turns (mean
    over episodes; 0 where an episode reported none).
val_env/NAME | as `env/NAME` | episode runs, {EVAL}
    `env/NAME` over greedy held-out episodes (the keys with one slash: `val_env/turns`, `val_env/tool_calls`,
    ...).
val_env/well_formed_calls | fraction | runs with `rl.tools`, {EVAL}
    Share of the held-out episodes' tool calls that parsed.
## Online preference pairs
online/pairs | pairs per prompt | `preference.pairs = "online"`, {LOGGED}
    Pairs made per prompt at the last refresh (1: every group made one; less: groups whose samples all scored
    alike were dropped).
online/tied_groups | fraction of prompts | `preference.pairs = "online"`, {LOGGED}
    Share of the prompts whose samples all scored alike, so made no pair.
online/reward | reward | `preference.pairs = "online"`, {LOGGED}
    The mean reward of the sampled candidates at the last refresh.
## On-policy distillation (GKD)
distill/on_policy_share | fraction of steps | `[distill]` runs, {LOGGED}
    Share of the steps so far on which the student wrote the completions itself (tends to `distill.lmbda` after
    `data_only_steps`).
distill/divergence | nats per token | `[distill]` runs with `sft_weight` > 0, {LOGGED}
    The generalised JSD to the teacher per completion token (the cross-entropy at the teacher's mistakes with
    `teacher_mistakes = "data"`).
distill/cross_entropy | nats per token | `[distill]` runs with `sft_weight` > 0, {LOGGED}
    The student's cross-entropy on the data's completion tokens, per token (before `sft_weight`).
val_distill/cross_entropy | nats per token | `[distill]` runs, {EVAL}
    The student's cross-entropy on the held-out completions, per token: reads as a supervised run's `val_loss`
    does (a distilled student's `val_loss` is the divergence it minimises).
val_distill/divergence | nats per token | `[distill]` runs, {EVAL}
    The divergence to the teacher on the held-out completions, per token (`val_loss` without `sft_weight`).
val_distill/corrected | fraction of tokens | `distill.teacher_mistakes = "data"`, {EVAL}
    `distill/corrected` over the held-out completions.
distill/corrected | fraction of tokens | `distill.teacher_mistakes = "data"`, {LOGGED}
    Share of the tokens that learned the data's token because the teacher's likeliest token was another (0 on
    the student's own samples).
## Multi-token prediction
mtp/loss | nats per token | `[mtp] depth` > 0, {LOGGED}
    The heads' weighted mean cross-entropy (before `mtp.weight`).
mtp/loss/K | nats per token | `[mtp] depth` >= K, {LOGGED}
    Head K's cross-entropy on the token K + 1 positions ahead.
val_mtp_loss/K | nats per token | `[mtp] depth` >= K, {EVAL}
    `mtp/loss/K` on the held-out rows.
val_mtp_acceptance/K | fraction | `[mtp] depth` >= K, {EVAL}
    Share of held-out positions where head K's greedy token is the main head's greedy token for the same
    position: what a greedy speculative decoder accepts.
## lm-evaluation-harness
harness/TASK/METRIC | the task's | `eval.harness_tasks`, every `eval.harness_every` steps and at the end
    Score METRIC of the lm-evaluation-harness task TASK (e.g. `harness/arc_easy/acc`; a filtered score adds its
    filter: `exact_match_strict-match`).
## Keys your own code names
NAME | yours | `[[pipeline.loss]]` or a Python API loss, {LOGGED}
    Each metric your own `LossCalculator` returns in `LossOutput.metrics`, under its own name; a `CompositeLoss`
    logs each part's loss under the part's name.
NAME/METRIC | yours | `CompositeLoss`, {LOGGED}
    A metric of a `CompositeLoss` part NAME.
NAME/weight | factor | `UncertaintyWeightedLoss`, {LOGGED}
    An `UncertaintyWeightedLoss` part's learned weight exp(-s).
NAME/log_var | log variance | `UncertaintyWeightedLoss`, {LOGGED}
    An `UncertaintyWeightedLoss` part's learned log variance s.
val_NAME | yours | custom data with an evaluation hook, {EVAL}
    A score your evaluation hook returns (a custom model's data: `ditty.data.generic.GenericTask`), prefixed
    with `val_`.
"""


def _parse(text: str) -> tuple[tuple[str, ...], tuple[Metric, ...]]:
    groups: list[str] = []
    metrics: list[Metric] = []
    head: list[str] = []
    meaning: list[str] = []

    def close() -> None:
        if head:
            key, unit, when = head
            for token, words in WHEN.items():
                when = when.replace(token, words)
            group = groups[-1]
            metrics.append(Metric(key, " ".join(meaning), unit, when, group, named_by_user=group == YOURS))

    for line in text.splitlines():
        if line.startswith("## "):
            close()
            head, meaning = [], []
            groups.append(line[3:].strip())
        elif line.startswith("    "):
            meaning.append(line.strip())
        elif line.strip():
            close()
            head, meaning = [part.strip() for part in line.split(" | ")], []
    close()
    return tuple(groups), tuple(metrics)


GROUPS, GLOSSARY = _parse(_ENTRIES)
"""The groups in the order of docs/metrics.md, and every entry."""


_PLACEHOLDER = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(PLACEHOLDERS) + r")(?![A-Za-z0-9])")


def _regex(key: str) -> re.Pattern:
    parts = _PLACEHOLDER.split(key)  # the placeholders at odd positions
    return re.compile("".join(PLACEHOLDERS[p] if i % 2 else re.escape(p) for i, p in enumerate(parts)))


@functools.cache
def _compiled() -> tuple[dict[str, Metric], list[tuple[re.Pattern, Metric]]]:
    exact = {m.key: m for m in GLOSSARY if not m.named_by_user and not _has_placeholder(m.key)}
    patterns = [(_regex(m.key), m) for m in GLOSSARY if not m.named_by_user and _has_placeholder(m.key)]
    return exact, patterns


def _has_placeholder(key: str) -> bool:
    return _PLACEHOLDER.search(key) is not None


def lookup(key: str) -> Optional[Metric]:
    """The entry that defines `key`: its own, else the first pattern that matches it whole."""
    exact, patterns = _compiled()
    if key in exact:
        return exact[key]
    return next((metric for pattern, metric in patterns if pattern.fullmatch(key)), None)


def defines(key: str) -> bool:
    return lookup(key) is not None


def undefined(keys) -> list[str]:
    """The keys of `keys` no entry defines, sorted."""
    return sorted({key for key in keys if not defines(key)})


def markdown() -> str:
    """docs/metrics.md's tables: one per group, a row per key."""
    out = []
    for group in GROUPS:
        rows = [m for m in GLOSSARY if m.group == group]
        out += [f"## {group}", "", "| key | meaning | unit | when |", "|---|---|---|---|"]
        out += [f"| `{m.key}` | {_cell(m.meaning)} | {_cell(m.unit)} | {_cell(m.when)} |" for m in rows]
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
