"""Post-training objectives as pure functions, for the preference (DPO family, reward models) and
reinforcement-learning (GRPO) stages.

- `logprobs`: per-token and per-sequence log-probabilities of completion tokens from the hidden
  states, in chunks through the model's output head (no full logits);
- `preference`: DPO (with label smoothing), IPO, SimPO, ORPO and KTO losses and their metrics;
- `reward_model`: the Bradley-Terry loss of a scalar reward model;
- `grpo`: group advantages and the clipped policy loss with its variants (DAPO, Dr. GRPO, GSPO);
- `rewards`: loading, checking, calling and weighting reward functions; `builtin_rewards`: ready ones.

The split-invariance rule every loss here follows: the caller passes the GLOBAL count that the loss
is a mean over (pairs, examples, sequences or tokens of the whole global batch, summed over
micro-batches and ranks before the forward); a loss and each of its metrics is then the local sum
divided by that count, so adding the values of all micro-batches and ranks (an all-reduce SUM)
gives the value of the whole batch, and the gradients of any split are the same.

Nothing here is imported by the package root; `rewards` and `builtin_rewards` import torch only
inside functions, so the recipe compiler can check reward references cheaply.
"""
