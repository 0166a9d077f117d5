"""Reinforcement learning with rollouts in the loop, as typed parts that pass one `RolloutBatch`:
sampler (`sampling`), environment (`environment`), advantage estimator (`advantages`) and assembler
(`assembler`), wired by the rollout stream (`stream`); the policy loss (`loss`), the held-out reward
(`evaluation`), the compiler's rules (`rules`) and the rows' builder (`row`). See ditty.objectives.rl.row."""
