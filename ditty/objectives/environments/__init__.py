"""What an episode sees and earns: the one `Environment` protocol (`protocol`: reset(row) ->
observation, step(completion) -> StepResult; reward functions are its one-turn case,
`RewardEnvironment`), episodes of several turns played through a sampler (`episodes`, `rendering`:
observations as chat-template tokens the model did not write), held-out episodes (`episode_evaluation`),
OpenEnv's environments (`openenv`) and the built-in tool environment (`tools/`)."""
