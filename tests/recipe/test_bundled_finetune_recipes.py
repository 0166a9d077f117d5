"""The bundled finetuning recipes (mistral_lora, llama3_qlora, qwen_lora) run end to end through the
command line, each on a tiny local model of its recipe's architecture instead of the 0.5-8B hub
model, on the built-in data, for two steps; then their outputs load as the README's run directory
section promises (the adapter with peft, final/merged/ with from_pretrained)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ditty.cli import main

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# recipe -> (architecture of its hub model, whether it writes final/merged/, whether the base is 4-bit)
FINETUNE_RECIPES = {
    "mistral_lora": ("mistral", True, False),
    "llama3_qlora": ("llama", False, True),
    "qwen_lora": ("qwen2", True, False),
}


def _save_tiny(path: Path, model_type: str, **overrides) -> str:
    """A 2-layer, 64-wide model of `model_type` with the byte tokenizer (as tests/conftest.py does)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **overrides,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_qwen2_dir(tmp_path_factory):
    return _save_tiny(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", use_sliding_window=False)


@pytest.fixture
def tiny_model_for(tiny_llama_dir, tiny_mistral_dir, tiny_qwen2_dir):
    return {"llama": tiny_llama_dir, "mistral": tiny_mistral_dir, "qwen2": tiny_qwen2_dir}.get


def tiny_run_args(recipe: str, model_dir: str, output_dir: Path) -> list[str]:
    """The recipe as shipped, except: the tiny model, the built-in data, two small CPU steps in fp32
    (the compiler's advice for the CPU, where bf16 crawls)."""
    four_bit = FINETUNE_RECIPES[recipe][2]
    return [
        str(RECIPES / f"{recipe}.toml"),
        "--model.path",
        model_dir,
        "--run.output_dir",
        str(output_dir),
        "--run.device",
        "cpu",
        "--train.steps",
        "2",
        "--train.global_batch_size",
        "4",
        "--train.micro_batch_size",
        "2",
        "--train.eval_samples",
        "4",
        "--train.log_every",
        "1",
        "--data.source",
        "builtin",
        "--data.name",
        "addition",
        "--data.format",
        "prompt_completion",
        "--data.max_seq_len",
        "32",
        "--data.num_samples",
        "64",
        "--checkpoint.every",
        "0",
        "--logging.progress",
        "false",
        "--scheduler.warmup_steps",
        "0",
        "--train.precision",
        "fp32",
        "--model.dtype",
        "float32",
        *(["--quant.compute_dtype", "float32"] if four_bit else []),
    ]


@pytest.mark.parametrize("recipe", list(FINETUNE_RECIPES))
def test_finetune_recipe_checks_with_a_tiny_model(recipe, tiny_model_for, tmp_path, capsys):
    architecture = FINETUNE_RECIPES[recipe][0]
    code = main(["check", *tiny_run_args(recipe, tiny_model_for(architecture), tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    with open(os.path.join(tiny_model_for(architecture), "config.json")) as handle:
        assert json.load(handle)["model_type"] == architecture


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(FINETUNE_RECIPES))
def test_finetune_recipe_runs_two_steps_on_a_tiny_model(recipe, tiny_model_for, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ditty.config.sections import ModelConfig, QuantConfig
    from ditty.models import build_model

    architecture, merged, four_bit = FINETUNE_RECIPES[recipe]
    model_dir = tiny_model_for(architecture)
    run_dir = tmp_path / "run"
    assert main(["run", *tiny_run_args(recipe, model_dir, run_dir)]) == 0

    env = json.loads((run_dir / "env.json").read_text())
    trainable, total = env["parameters"]["trainable"], env["parameters"]["total"]
    assert 0 < trainable < total / 2  # an adapter run, not a full finetune
    final = run_dir / "final"
    assert (final / "adapter_config.json").is_file() and (final / "adapter_model.safetensors").is_file()
    assert not (final / "model.safetensors").exists()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 2

    quant = QuantConfig(kind="bnb-4bit", compute_dtype="float32") if four_bit else QuantConfig()
    # The adapter on the base as the run built it: 4-bit for QLoRA, embeddings grown to the run's
    # tokenizer (qwen2's tiny config gains a token there, so peft saved the resized embeddings).
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    base = build_model(ModelConfig(path=model_dir), tokenizer=tokenizer, quant=quant)
    adapted = PeftModel.from_pretrained(base, str(final))
    ids = torch.randint(3, 259, (2, 12))
    with torch.no_grad():
        adapted_logits = adapted(input_ids=ids).logits.float()
    assert torch.isfinite(adapted_logits).all()
    if merged:
        plain = AutoModelForCausalLM.from_pretrained(str(final / "merged"))
        with torch.no_grad():
            torch.testing.assert_close(plain(input_ids=ids).logits.float(), adapted_logits, rtol=0, atol=1e-4)
    else:
        assert not (final / "merged").exists()
