"""Training objectives: the table of what a run optimises (`table`), and each row's parts.

- `table`: `OBJECTIVES` (supervised, reward model, the DPO family, GRPO) and `objective_choice`;
  `parts`: what a row builds (`ObjectiveParts`); `footprint`: what it holds, for the planner;
- `supervised`, `pairs`, `online_pairs`, `gkd`, `rl/`: the rows' builders, compiler rules, plan rows
  and model-card lines;
- `dpo_family`, `reward_model`, `jsd`, `rl/grpo`: the losses as pure functions, each tested against its
  paper and TRL; `preference_loss`, `reward_stage`, `rl/loss`: the loss stages that run them in the step;
- `reference`: the one reference model (adapter disabled, frozen copy, another checkpoint, precomputed);
- `logprobs`: per-token and per-sequence log-probabilities through the output head in chunks;
- `sampling/`: the one sampled stream of every on-policy row (samplers, policy versions, weight sync,
  sampling ahead, the correction, `RolloutBatch`, `[rollout]`'s rules);
- `environments/`: the Environment protocol, episodes of several turns, OpenEnv, the tool environment;
- `rewards/`: loading, checking, calling and weighting reward functions, the built-in ones, a reward
  model as one;
- `rl/`: reinforcement learning's advantage estimators, policy losses, assembler and rollout stream.

The split-invariance rule every loss here follows: the caller passes the GLOBAL count that the loss
is a mean over (pairs, examples, sequences or tokens of the whole global batch, summed over
micro-batches and ranks before the forward); a loss and each of its metrics is then the local sum
divided by that count, so adding the values of all micro-batches and ranks (an all-reduce SUM)
gives the value of the whole batch, and the gradients of any split are the same.

Nothing here is imported by the package root; `table`, `footprint`, `rewards` and the rules import no
torch, so the recipe compiler reads them cheaply.
"""
