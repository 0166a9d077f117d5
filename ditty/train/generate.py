"""`generate(run_dir, prompt)`: text from a run's final model, the way a user would load it.

It goes through `from_pretrained` on `RUN_DIR/final` (not the in-memory model), so it also proves
that the saved model is complete. Greedy by default, hence deterministic.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import torch

from ditty.config.errors import RecipeError
from ditty.train.final import FINAL_DIR


def load_final(run_dir: str, device: str = "cpu"):
    """(model, tokenizer) from RUN_DIR/final (or a final/ directory itself) with the Auto class of its
    model task (ditty.models.tasks); adapters through peft. Only tasks that write text generate: a
    classifier's final/ is a RecipeError that says how to use it instead."""
    import peft
    import transformers
    from transformers import AutoTokenizer

    from ditty.train.final import final_model_task

    path = os.path.join(run_dir, FINAL_DIR) if os.path.isdir(os.path.join(run_dir, FINAL_DIR)) else run_dir
    if not os.path.isfile(os.path.join(path, "config.json")) and not os.path.isfile(
        os.path.join(path, "adapter_config.json")
    ):
        raise RecipeError.single(
            f"no final model in {run_dir!r} (expected {os.path.join(run_dir, FINAL_DIR)}/config.json)",
            fix="give the directory of a finished run (it writes final/ at the end)",
        )
    from ditty.checkpoint.integrity import check_model_dir

    check_model_dir(path)  # its manifest: no damaged file is loaded
    task = final_model_task(run_dir)
    if not task.generates:
        merged = os.path.join(path, "merged")  # an adapter's merged model: what the pipeline loads
        loadable = merged if os.path.isfile(os.path.join(merged, "config.json")) else path
        raise RecipeError.single(
            f"{run_dir!r} holds a {task.name} model, which does not generate text",
            fix=f'use it with transformers: pipeline("{task.pipeline}", model="{loadable}")',
        )
    if os.path.isfile(os.path.join(path, "adapter_config.json")) and task.peft_auto_class:
        model = getattr(peft, task.peft_auto_class).from_pretrained(path)
    else:
        model = getattr(transformers, task.auto_class).from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.to(device).eval(), tokenizer


@torch.no_grad()
def generate(
    run_dir: str,
    prompt: str,
    max_new_tokens: int = 64,
    sample: bool = False,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: Optional[int] = 0,
    device: str = "cpu",
    chat: bool = False,
    speculative: Optional[str] = None,
) -> str:
    """The model's continuation of `prompt` (the new text only, special tokens removed).

    `chat`: the prompt is one user message, rendered with the tokenizer's chat template and its
    generation prompt, as a chat-trained model saw conversations in training (data.format = "chat").

    Greedy unless `sample` (the same KV-cached greedy search as validation's exact match,
    ditty.data.task.greedy_generate, stopping at the end-of-sequence token); sampling is seeded by
    `seed` so a command line call is repeatable. `speculative = "mtp"`: the same greedy text, drafted by
    the run's MTP heads and verified by the model (ditty.models.mtp.speculative).
    """
    model, tokenizer = load_final(run_dir, device)
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise RecipeError.single(
                f"--chat needs a chat template, and the tokenizer of {run_dir!r} has none",
                fix='train with tokenizer.chat_template = "chatml" (or a Jinja file), or leave out --chat',
            )
        conversation = [{"role": "user", "content": prompt}]
        prompt = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    if speculative == "mtp":
        return speculative_text(model, tokenizer, run_dir, prompt, max_new_tokens, add_special_tokens=not chat)
    if not sample:
        from ditty.data.task import greedy_generate

        # A rendered template holds its own special tokens, as the chat format tokenized it in training.
        return greedy_generate(model, tokenizer, [prompt], device, max_new_tokens, add_special_tokens=not chat)[0]
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=not chat).to(device)
    if seed is not None:
        torch.manual_seed(seed)
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
    )
    # A decoder-only model returns the prompt and its continuation; an encoder-decoder only the output.
    new_tokens = output[0] if model.config.is_encoder_decoder else output[0, inputs["input_ids"].shape[1] :]
    return tokenizer.decode(new_tokens, skip_special_tokens=True)


def speculative_text(
    model, tokenizer, run_dir: str, prompt: str, max_new_tokens: int, *, add_special_tokens: bool = True
) -> str:
    """Greedy text drafted by the MTP heads of the run's final/ (see `generate`); how many drafts the
    model accepted goes to stderr."""
    import sys

    from ditty.models.mtp.heads import build_heads
    from ditty.models.mtp.speculative import greedy_decode
    from ditty.models.mtp.weights import depth_saved, load_heads

    path = os.path.join(run_dir, FINAL_DIR) if os.path.isdir(os.path.join(run_dir, FINAL_DIR)) else run_dir
    depth = depth_saved(path)
    if depth == 0:
        raise RecipeError.single(
            f"{path} holds no MTP heads to draft with",
            key="--speculative",
            fix="train with [mtp] depth = 1 (or more), or leave out --speculative",
        )
    heads = build_heads(model, depth)
    load_heads(heads, model, path)
    heads.eval()
    ids = tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
    new, stats = greedy_decode(model, ids, max_new_tokens, tokenizer.eos_token_id, heads)
    print(
        f"speculative (mtp, depth {depth}): {stats.new_tokens} tokens in {stats.model_forwards} forwards of the "
        f"model; drafts accepted {stats.accepted} of {stats.drafted}",
        file=sys.stderr,
    )
    if tokenizer.eos_token_id in new:
        new = new[: new.index(tokenizer.eos_token_id)]
    return tokenizer.decode(new, skip_special_tokens=True)


@torch.no_grad()
def generate_episode(
    run_dir: str, prompt: str, tools: list[str], *, max_new_tokens: int = 64, max_turns: int = 4, device: str = "cpu"
) -> str:
    """One greedy episode of the run's final model with `tools` ("package.module:function"), as RL
    runs them (ditty.objectives.environments.tools.tool_environment): the prompt is the user's
    message, each tool call is answered by the tool, until the model answers without a call or after
    `max_turns` turns. Returns the episode's text after the prompt: the model's turns and the tools'
    messages as the chat template renders them."""
    from ditty.config.rl import RLConfig
    from ditty.config.rollout import RolloutConfig
    from ditty.objectives.environments.episodes import EpisodeEnvironment
    from ditty.objectives.environments.rendering import ObservationRenderer
    from ditty.objectives.environments.tools.calls import call_format_for
    from ditty.objectives.environments.tools.tool_environment import ToolEnvironment, load_tools, tool_schemas
    from ditty.objectives.sampling.generate_sampler import GenerateSampler

    model, tokenizer = load_final(run_dir, device)
    if not getattr(tokenizer, "chat_template", None):
        raise RecipeError.single(
            f"--tools runs a chat episode, and the tokenizer of {run_dir!r} has no chat template",
            fix='train with tokenizer.chat_template = "chatml" (or a Jinja file)',
        )
    functions = load_tools(tools, key="--tools")
    rl = RLConfig(kind="grpo", max_turns=max_turns, tools=list(tools), group_size=2)
    rl = dataclasses.replace(rl, max_episode_tokens=max_new_tokens * max_turns * 4)
    rollout = RolloutConfig(max_new_tokens=max_new_tokens)
    calls = call_format_for(tokenizer.chat_template)
    episodes = EpisodeEnvironment(
        lambda: ToolEnvironment(functions, calls, rl.tool_timeout_s),
        "ToolEnvironment",
        [],
        ObservationRenderer(tokenizer, 1_000_000, tools=tool_schemas(functions)),
        rl,
        rollout,
        key="--tools",
    )
    sampler = GenerateSampler(lambda: model, rollout, 1, tokenizer, torch.device(device), seed=0)
    rollouts = episodes.run(sampler, {"prompts": [prompt], "columns": {}}, 0, 1, greedy=True)
    return tokenizer.decode(rollouts.completion_ids[0], skip_special_tokens=True)
