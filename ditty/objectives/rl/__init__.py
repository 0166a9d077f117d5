"""Reinforcement learning rows (GRPO, RLOO) as typed parts that pass one `RolloutBatch`: they sample
through ditty.objectives.sampling and play ditty.objectives.environments; here are the advantage
estimators (`estimators`, per-turn credit in `turn_credit`), the policy losses (`policy_losses`, the
math in `grpo` and `rloo`, the loss stage in `loss`), the assembler (`assembler`), the rollout
stream that runs them once per step (`stream`), the held-out reward (`evaluation`), the part
interfaces and contract checks users' parts pass (`interfaces`, `contracts`; public as ditty.rl), the
compiler's rules (`rl_rules`) and the rows' builder (`row`)."""
