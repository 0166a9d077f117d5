"""[rl] and data.format = "prompt" through the compiler and `ditty check`, in-process: each bad
input is exit code 2 with a message naming the key and a fix, before any weights load."""

from __future__ import annotations

import json

import pytest

from ditty.cli import main
from ditty.config.loader import load_recipe, parse_recipe
from ditty.config.overrides import apply_overrides
from ditty.recipe import compile_recipe

RECIPE = """
[model]
init = "random"
architecture = "llama"
[model.config]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 2
num_attention_heads = 2
num_key_value_heads = 2
max_position_embeddings = 64
[tokenizer]
kind = "byte"
[data]
source = "builtin"
name = "addition"
format = "prompt"
max_seq_len = 32
num_samples = 200
[train]
steps = 2
global_batch_size = 8
micro_batch_size = 4
[rl]
kind = "grpo"
group_size = 4
rewards = ["ditty.objectives.rewards.builtin_rewards:exact_match"]
[rollout]
max_new_tokens = 4
"""


def check(tmp_path, capsys, *flags):
    path = tmp_path / "grpo.toml"
    path.write_text(RECIPE)
    code = main(["check", str(path), *flags])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_grpo_recipe_checks(tmp_path, capsys):
    code, out = check(tmp_path, capsys)
    assert code == 0, out
    assert "ok: the recipe is valid" in out


@pytest.mark.parametrize(
    "flags, key, words",
    [
        (["--rl.rewards", '["no_such_module.rewards:correct"]'], "rl.rewards[0]", "cannot import module"),
        (["--rl.rewards", '["ditty.objectives.rewards.builtin_rewards:no_such"]'], "rl.rewards[0]", "no_such"),
        (["--rl.rewards", '["tests.rl.rewards_for_tests:wrong_signature"]'], "rl.rewards[0]", "reward_fn(task"),
        (
            ["--train.global_batch_size", "6", "--train.micro_batch_size", "2"],
            "train.global_batch_size",
            "groups of rl.group_size = 4",
        ),
        (["--data.format", "prompt_completion"], "data.format", 'not data.format = "prompt_completion"'),
        (["--rl.reward_weights", "[1.0, 2.0]"], "rl.reward_weights", "2 weights for 1 reward functions"),
        (
            ["--rollout.max_staleness", "1"],
            "rollout.max_staleness",
            'rollout.backend = "generate" samples from the live policy',
        ),
        (["--rollout.sampler_correction", "tis"], "rollout.sampler_correction", "reports no log-probabilities"),
        (
            ["--rollout.backend", "vllm-server", "--rollout.vllm_server", "localhost:8000"],
            "rollout.vllm_server",
            "not an http",
        ),
        (["--rollout.backend", "vllm", "--rollout.vllm_memory", "1.5"], "rollout.vllm_memory", "in (0, 1)"),
        (
            ["--rollout.backend", "vllm", "--rollout.max_staleness", "1", "--rl.updates_per_rollout", "2"],
            "rollout.max_staleness",
            "updates_per_rollout > 1",
        ),
        (
            ["--rollout.backend", "vllm-server", "--peft.kind", "lora", "--quant.kind", "bnb-4bit"],
            "quant.kind",
            "packed by bitsandbytes",
        ),
        (["--rl.group_size", "1"], "rl.group_size", "at least 2"),
        (["--rl.negative_advantage_scale", "-1"], "rl.negative_advantage_scale", "0 or more"),
        (["--rollout.temperature", "0"], "rollout.temperature", "above 0"),
    ],
)
def test_bad_rl_input_is_exit_2_naming_the_key(tmp_path, capsys, flags, key, words):
    code, out = check(tmp_path, capsys, *flags)
    assert code == 2, out
    assert f"`{key}`" in out and words in out, out
    assert "fix:" in out and "Traceback" not in out


def test_vllm_without_vllm_installed_is_exit_2_saying_how_to_install_it(tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    code, out = check(tmp_path, capsys, "--rollout.backend", "vllm")
    assert code == 2 and "`rollout.backend`" in out and "vllm is not installed" in out, out
    assert "make setup-vllm" in out and 'pip install "ditty[vllm]"' in out


def test_the_old_backend_name_still_runs_with_a_warning(tmp_path, capsys):
    code, out = check(tmp_path, capsys, "--rollout.backend", "transformers")
    assert code == 0, out
    assert '`rollout.backend` "transformers" is the old name' in out and 'write rollout.backend = "generate"' in out


def test_the_rl_sampling_keys_still_work_under_their_old_names_with_a_warning(tmp_path, capsys):
    """[rl]'s sampling keys moved to [rollout]: written in [rl] or as --rl.* flags they still apply, and
    the check names the new key at the line (or the flag) that wrote the old one."""
    path = tmp_path / "old.toml"
    path.write_text(
        RECIPE.replace("[rollout]\nmax_new_tokens = 4\n", "").replace(
            "group_size = 4", "group_size = 4\nmax_new_tokens = 3"
        )
    )
    loaded = apply_overrides(load_recipe(str(path)), ["--rl.temperature", "0.5"])
    assert loaded.config.rollout.max_new_tokens == 3 and loaded.config.rollout.temperature == 0.5
    assert main(["check", str(path), "--rl.temperature", "0.5"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    line = next(i for i, row in enumerate(path.read_text().splitlines(), start=1) if row.startswith("max_new_tokens"))
    assert f"old.toml:{line}: `rl.max_new_tokens` is now rollout.max_new_tokens" in text, text
    assert "`rl.temperature` is now rollout.temperature" in text and "(set by --rl.temperature)" in text
    both = tmp_path / "both.toml"
    both.write_text(RECIPE.replace("group_size = 4", "group_size = 4\nmax_new_tokens = 3"))
    assert main(["check", str(both)]) == 2
    assert "`rl.max_new_tokens` and rollout.max_new_tokens are one key" in capsys.readouterr().err


def test_prompt_data_without_rl_is_refused():
    text = RECIPE.replace('kind = "grpo"', 'kind = "none"')
    plan = compile_recipe(parse_recipe(text, source="r.toml"))
    errors = [p for p in plan.problems if p.severity == "error"]
    assert [p.key for p in errors] == ["data.format"], [p.format() for p in plan.problems]
    assert any(p.key == "rl.group_size" and p.severity == "warning" for p in plan.problems)


def test_groups_stay_whole_on_every_rank():
    plan = compile_recipe(parse_recipe(RECIPE, source="r.toml"), world_size=4)
    assert any("do not split over 4 ranks" in p.message for p in plan.problems), [p.format() for p in plan.problems]


def test_prompt_rows_keep_their_columns_for_the_rewards(tmp_path):
    """A file of prompts (text and chat messages) keeps every other column, in the collated batch."""
    from ditty.config.sections import DataConfig, ModelConfig, TokenizerConfig
    from ditty.data.build import build_data
    from ditty.data.tokenizer import build_tokenizer

    rows = [
        {"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1), "level": i % 3} for i in range(12)
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = build_tokenizer(TokenizerConfig(kind="byte", chat_template="chatml"), ModelConfig())
    data = DataConfig(source="file", path=str(path), format="prompt", max_seq_len=64, val_fraction=0.0)
    bundle = build_data(data, tokenizer, seed=0)
    batch = bundle.collator([bundle.train[i] for i in range(len(bundle.train))])
    assert sorted(batch["columns"]) == ["answer", "level"]
    by_prompt = {json.dumps(p): (a, lv) for p, a, lv in zip(batch["prompts"], *batch["columns"].values())}
    assert by_prompt[json.dumps(rows[3]["prompt"])] == ("4", 0)
    chat_ids = batch["prompt_ids"][[json.dumps(p) for p in batch["prompts"]].index(json.dumps(rows[5]["prompt"]))]
    assert tokenizer.decode(chat_ids).endswith("assistant\n")  # the chat template's generation prompt


@pytest.mark.parametrize("layout", ["jsonl", "json"])
def test_a_prompt_row_without_a_column_the_others_have_is_a_bad_row(tmp_path, layout):
    """Every column reaches the reward functions: a row lacking `answer` (or holding null) would score
    against None, so it is a bad row naming its line, as a missing prompt is."""
    from ditty.config.errors import RecipeError
    from ditty.config.sections import DataConfig, ModelConfig, TokenizerConfig
    from ditty.data.build import build_data
    from ditty.data.tokenizer import build_tokenizer

    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]
    rows[3] = {"prompt": "3+1="}
    rows[5] = {"prompt": "5+1=", "answer": None}
    path = tmp_path / f"prompts.{layout}"
    text = (
        "".join(json.dumps(r) + "\n" for r in rows)
        if layout == "jsonl"
        else "[\n" + ",\n".join(map(json.dumps, rows)) + "\n]"
    )
    path.write_text(text)
    tokenizer = build_tokenizer(TokenizerConfig(kind="byte"), ModelConfig())
    data = DataConfig(source="file", path=str(path), format="prompt", max_seq_len=64, val_fraction=0.0)
    with pytest.raises(RecipeError) as caught:
        build_data(data, tokenizer, seed=0)
    message = str(caught.value)
    first = 1 if layout == "jsonl" else 2  # the array's "[" takes line 1
    assert f"{path}:{first + 3}: 'answer' is missing (line {first} has it" in message, message
    assert f"{path}:{first + 5}: 'answer' is null" in message, message


def test_a_prompt_is_text_or_chat_messages():
    from ditty.data.formats.prompt import prompt_problem

    assert prompt_problem("12+47=", "prompt") is None
    assert prompt_problem([{"role": "user", "content": "hi"}], "prompt") is None
    assert "empty" in prompt_problem("  ", "prompt")
    assert "chat messages" in prompt_problem([{"text": "hi"}], "prompt")
    assert "got int" in prompt_problem(7, "prompt")


def test_the_python_api_takes_the_original_libraries_reward_fn(tmp_path):
    """RuntimeComponents(reward_functions=[...]) replaces rl.rewards; a reward_fn(task, completion_text)
    returning (reward, metrics) is wrapped, called with each row, and its metrics are logged."""
    import json as _json
    from dataclasses import replace

    from ditty.train import Trainer
    from ditty.train.components import RuntimeComponents
    from tests.rl.helpers import grpo_config

    seen = []

    def reward_fn(task, completion_text):
        seen.append(task)
        return float(len(completion_text)), {"digits": float(sum(ch.isdigit() for ch in completion_text))}

    config = grpo_config(tmp_path, train=dict(steps=2))
    config = replace(config, rl=replace(config.rl, rewards=[]))
    result = Trainer(config, components=RuntimeComponents(reward_functions=[reward_fn])).train()
    assert result.final_dir
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "reinforcement learning: GRPO (" in card and "rewards: reward functions given in Python" in card
    assert seen and set(seen[0]) == {"prompt", "completion"} and seen[0]["prompt"].endswith("=")
    rows = [_json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1 and "loss" in r)
    assert "rewards/reward_fn/mean" in step and "rewards/reward_fn/digits" in step
    assert step["reward"] == step["rewards/reward_fn/mean"]


def test_a_model_given_in_python_is_its_own_kl_reference(tmp_path):
    """rl.beta > 0 on a model given as an object (no [model] path to load again): the reference is a
    copy of it taken before the first step, so the first step's KL is 0 and the run trains."""
    import json as _json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ditty.train import Trainer
    from ditty.train.components import RuntimeComponents
    from tests.rl.helpers import TINY_LLAMA, grpo_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    config = grpo_config(
        tmp_path, train=dict(steps=2), beta=0.1, rewards=["tests.rl.rewards_for_tests:text_hash_reward"]
    )
    Trainer(config, components=RuntimeComponents(model=model)).train()
    rows = [_json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kl = [row["kl"] for row in rows if "kl" in row and "step" in row]
    assert len(kl) == 2 and kl[0] == 0.0 and kl[1] > 0  # the copy is the start; the policy moves away


def test_a_prompt_longer_than_max_seq_len_is_a_bad_row_not_cut(tmp_path):
    """Cut at its start a prompt loses BOS and its question; cut at its end, the generation prompt. So
    a longer one is refused, or left out and counted with data.on_bad_rows = "skip"."""
    from ditty.config.errors import RecipeError
    from ditty.config.sections import DataConfig
    from ditty.data.build import build_data
    from ditty.data.tokenizer import byte_tokenizer

    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]
    rows[4]["prompt"] = "Please add these two numbers and answer with the sum only: 4+1="
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = DataConfig(source="file", path=str(path), format="prompt", max_seq_len=16, val_fraction=0.0)
    with pytest.raises(RecipeError) as caught:
        build_data(data, byte_tokenizer(), seed=0)
    (problem,) = caught.value.problems
    assert problem.key == "data.max_seq_len"
    assert "1 of 10 samples of data.path cannot be used once cut to data.max_seq_len = 16 tokens" in problem.message
    assert "a prompt of 64 tokens ('Please add these" in problem.message and 'on_bad_rows = "skip"' in problem.fix
    skipped = build_data(DataConfig(**{**data.__dict__, "on_bad_rows": "skip"}), byte_tokenizer(), seed=0)
    assert len(skipped.train) == 9 and skipped.skipped_rows == 1
    kept = [byte_tokenizer().decode(sample["input_ids"]) for sample in skipped.train]
    assert all(text.startswith("<s>") for text in kept)  # every prompt whole, from its first token


GPT2 = [
    "--model.architecture",
    "gpt2",
    "--model.config",
    "{n_embd = 32, n_layer = 2, n_head = 2, n_positions = 64}",
]


@pytest.mark.parametrize(
    "flags, key, words",
    [
        (["--rollout.max_new_tokens", "40"], "rollout.max_new_tokens", "+ 40 = "),
        (
            [
                "--rl.tools",
                '["ditty.objectives.environments.tools.builtin_tools:calculator"]',
                "--rl.max_episode_tokens",
                "33",
            ],
            "rl.max_episode_tokens",
            "+ 33 = ",
        ),
    ],
)
def test_a_rollout_longer_than_the_models_positions_is_refused_as_sft_refuses_it(
    tmp_path, capsys, tiny_llama_dir, flags, key, words
):
    """A prompt of data.max_seq_len tokens and what a rollout adds after it must fit the model's learned
    positions (GPT-2's n_positions), as data.max_seq_len alone must for SFT; rotary positions are refused
    alike on every backend (a vLLM engine refuses such a context, generate would run past them)."""
    code, out = check(tmp_path, capsys, *GPT2, *flags)
    assert code == 2 and f"`{key}`" in out and words in out and "longer than the model's 64 positions" in out, out
    assert "Traceback" not in out
    code, out = check(tmp_path, capsys, *GPT2)  # 32 + 4 fit
    assert code == 0 and "model's 64 positions" not in out, out
    # A saved Llama (rotary positions), on generate and on vLLM.
    llama = ["--model.path", tiny_llama_dir, "--model.init", "pretrained", "--data.max_seq_len", "224"]
    for backend in ("generate", "vllm"):
        code, out = check(tmp_path, capsys, *llama, *flags, "--rollout.backend", backend)
        assert code == 2 and f"`{key}`" in out and "is longer than the model's" in out, out
        assert "a vLLM engine refuses such a context" in out and "generate would run past" in out, out


def test_the_bundled_tool_recipe_is_refused_an_episode_budget_past_its_models_positions(tmp_path, capsys):
    """`ditty check tiny_tools` on a model of tiny_tools_sft's 192 positions: its own budget (32 + 160)
    fits; 32 + 400 is exit 2 naming the lengths, the positions and the key to lower."""
    from tests.conftest import _save_tiny

    model = tmp_path / "tools_sft_final"
    _save_tiny(model, "llama", max_position_embeddings=192)
    code = main(["check", "tiny_tools", "--model.path", str(model), "--data.max_seq_len", "32"])
    out = "".join(capsys.readouterr())
    assert code == 0 and "positions" not in out, out
    flags = ["--model.path", str(model), "--data.max_seq_len", "32", "--rl.max_episode_tokens", "400"]
    code = main(["check", "tiny_tools", *flags])
    out = "".join(capsys.readouterr())
    assert code == 2 and "`rl.max_episode_tokens`" in out, out
    assert "32 + 400 = 432 tokens is longer than the model's 192 positions" in out, out
    assert "set rl.max_episode_tokens to at most 160" in out and "Traceback" not in out, out


def test_vllm_on_cpu_is_refused_a_head_size_its_attention_has_no_kernel_for(tmp_path, capsys):
    """vLLM's CPU attention has kernels for some head widths only (32, 64, ...): the recipe's 16-wide
    heads are refused by check, naming the width and where it was read, instead of failing at the
    engine's start; 32-wide heads pass this rule, and generate takes any width."""
    narrow = ["--run.device", "cpu", "--rollout.backend", "vllm"]
    code, out = check(tmp_path, capsys, *narrow)
    assert code == 2 and "the model's attention heads are 16 wide (hidden_size 32 / 2 heads in model.config)" in out
    assert "kernels for heads of 32, 64, 80" in out, out
    wide = ["--model.config", "{hidden_size = 64, num_attention_heads = 2, num_key_value_heads = 2}"]
    code, out = check(tmp_path, capsys, *narrow, *wide)
    assert "heads are" not in out, out
    code, out = check(tmp_path, capsys, "--run.device", "cpu")
    assert code == 0 and "heads are" not in out, out
