"""The one sampled stream every on-policy row draws from (GRPO and RLOO, online pairs, GKD): a
sampler behind the `Sampler` ABC, kept at the policy's version by `PolicySampling`.

- `sampler`: the `Sampler` ABC (sample, generate_turn -> TurnOutput, capture/load) and `sync_weights`;
- `generate_sampler`, `vllm_sampler`, `vllm_server`: the three samplers (transformers' generate on
  the live policy, a vLLM engine in the process, a vLLM server), the only modules that call a
  model's or an engine's generate for on-policy sampling;
- `policy_sampling`: the policy version counted in optimizer updates, weight sync, sampling ahead
  (`ahead`: up to `rollout.max_staleness` batches on a sampler thread);
- `policy_weights`: the policy's weights as a sampler loads them; `adapter_sync`: a LoRA policy's
  adapter alone, for an engine that serves it;
- `vllm_cpu`: what vLLM's CPU engine needs before it starts (its KV cache size, a head size it has kernels for);
- `correction`: TIS/MIS for what a sampler of its own numerics drew;
- `batch`: `RolloutBatch`, what every part passes on;
- `stream_state`: what a stream keeps in a checkpoint beside the prompt cursor;
- `rollout_rules`: the compiler's rules of `[rollout]`.
"""
