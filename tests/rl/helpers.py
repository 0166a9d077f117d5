"""Configs of tiny GRPO runs for the [rl] tests (a 2-layer, 32-wide Llama, the byte tokenizer, the
built-in addition prompts)."""

from __future__ import annotations

from dataclasses import fields, replace

from ditty.config import TrainerConfig
from ditty.config.rl import RLConfig
from ditty.config.rollout import RolloutConfig
from ditty.config.sections import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainConfig,
)

TINY_LLAMA = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


ROLLOUT_FIELDS = {f.name for f in fields(RolloutConfig)}


def split_rollout(changes: dict) -> tuple[dict, dict]:
    """(the [rl] fields of `changes`, its [rollout] fields): the tests name both as the rl settings."""
    rollout = {k: v for k, v in changes.items() if k in ROLLOUT_FIELDS}
    return {k: v for k, v in changes.items() if k not in ROLLOUT_FIELDS}, rollout


def grpo_config(tmp_path, *, train=None, optimizer=None, checkpoint=None, **rl) -> TrainerConfig:
    rl_cfg = dict(kind="grpo", group_size=4, rewards=["ditty.objectives.rewards.builtin_rewards:exact_match"])
    changes, rollout = split_rollout(rl)
    rl_cfg.update(changes)
    train_cfg = dict(
        steps=2,
        global_batch_size=8,
        micro_batch_size=4,
        log_every=1,
        eval_every=0,
        eval_samples=0,
        max_grad_norm=0.0,
        precision="fp32",
    )
    train_cfg.update(train or {})
    return TrainerConfig(
        run=RunConfig(name="grpo-test", output_dir=str(tmp_path / "run"), seed=0, device="cpu", num_threads=1),
        model=ModelConfig(init="random", architecture="llama", config=dict(TINY_LLAMA)),
        tokenizer=TokenizerConfig(kind="byte"),
        data=DataConfig(source="builtin", name="addition", format="prompt", max_seq_len=32, num_samples=400),
        train=TrainConfig(**train_cfg),
        optimizer=OptimizerConfig(**(optimizer or dict(lr=1e-3))),
        scheduler=SchedulerConfig(kind="constant"),
        logging=LoggingConfig(progress=False),
        checkpoint=CheckpointConfig(**(checkpoint or {})),
        rl=RLConfig(**rl_cfg),
        rollout=RolloutConfig(**{"max_new_tokens": 4, **rollout}),
    )


def with_rl(config: TrainerConfig, **changes) -> TrainerConfig:
    """`config` with [rl] and [rollout] fields changed (a sampling field goes to [rollout])."""
    rl, rollout = split_rollout(changes)
    return replace(config, rl=replace(config.rl, **rl), rollout=replace(config.rollout, **rollout))


def save_turn_ending_llama(path, eos_weight: float = 0.8, **overrides) -> str:
    """A tiny random Llama (TINY_LLAMA, the byte tokenizer) that ends its turns within a few tokens,
    saved in Hugging Face format: coordinate 0 of the residual stream is a constant 5 (every token's
    embedding holds it and no layer writes to it), and the head reads it into the end-of-sequence
    logit (p about 0.25 a token at 0.8). Episodes with it have several turns. `overrides` replace
    TINY_LLAMA's fields (vLLM's CPU attention needs heads of 32, say)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_LLAMA, "max_position_embeddings": 256, **overrides},
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 5.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tokenizer.eos_token_id, 0] = eos_weight
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
