"""Code written for the original Ditty runs on ditty (issue 15): a whole script, then every public
name of the original used the way its README and docstrings use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ditty
from ditty import (
    CheckpointManager,
    ContractParseError,
    RecipeError,
    TrainerState,
)
from tests.compat import ported_script


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread beats two on a shared CPU
    yield
    torch.set_num_threads(before)


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{run_dir}/metrics.jsonl")) if "loss" in r}


def test_a_script_for_the_original_ditty_trains_checkpoints_resumes_and_refuses_a_broken_chain(
    tmp_path, tiny_llama_dir, capsys
):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    run = tmp_path / "run"
    pipeline = ported_script.main(str(run), 4, tiny_llama_dir)
    out = capsys.readouterr().out
    assert "contracts: 5 of 5 stages checked; the chain fits" in out  # print_pipeline before training
    assert "loss (UncertaintyWeightedLoss) part 1 (ClassLoss) (learned weight)" in out

    # Checkpoints every 2 steps, readable with the original's CheckpointManager and TrainerState.
    manager = CheckpointManager(str(run))
    assert manager.get_latest_checkpoint_num() == 4
    checkpoint = manager.load()
    state = TrainerState()
    state.load_state_dict(checkpoint.training_state)
    assert state.steps == 4 and manager.load(2).training_state["steps"] == 2
    assert set(checkpoint.model_state) == set(ported_script.Denoiser().state_dict())
    # The loss's learned log-variances trained with the model and were checkpointed with it.
    learned = pipeline.loss_calculator.log_vars.detach()
    assert not torch.equal(learned, torch.zeros(2)) and torch.equal(checkpoint.loss_state["log_vars"], learned)
    # gradient_checkpointing=True wrapped the FSDPConfig's transformer_layers (a model without _no_split_modules).
    wrapped = [m for m in pipeline.model.modules() if isinstance(m, ActivationWrapper)]
    assert len(wrapped) == 2 and all(isinstance(m._checkpoint_wrapped_module, ported_script.Block) for m in wrapped)
    # The MetricsLogger got the records (TensorBoard files); the TokenizerFactory's tokenizer was saved.
    assert any((run / "logs").iterdir()) and (run / "final" / "tokenizer.json").exists()

    # Run again with more steps: it resumes from step 4 and continues exactly as an uninterrupted run.
    ported_script.main(str(run), 6, tiny_llama_dir)
    assert "resumed from step 4" in capsys.readouterr().out
    straight = tmp_path / "straight"
    ported_script.main(str(straight), 6, tiny_llama_dir)
    assert losses(run) == losses(straight) and sorted(losses(run)) == [1, 2, 3, 4, 5, 6]

    # A chain that does not fit is refused at construction, naming the stage; nothing is written.
    with pytest.raises(ContractParseError) as caught:
        ported_script.build(str(tmp_path / "broken"), 4, tiny_llama_dir, broken=True)
    assert isinstance(caught.value, RecipeError)
    assert "`model (Denoiser)` reads ctx.forward_kwargs.t before any stage provides it" in str(caught.value)
    assert "`loss (UncertaintyWeightedLoss) part 1 (ClassLoss)` reads ctx.label before any stage" in str(caught.value)
    assert not (tmp_path / "broken").exists()


def test_every_original_name_is_importable_from_ditty():
    names = [
        "Pipeline",
        "ModelFactory",
        "FSDPConfig",
        "QuantConfig",
        "PeftConfig",
        "TokenizerFactory",
        "ModelTransform",
        "MetricsLogger",
        "TrainerState",
        "CheckpointManager",
        "Checkpoint",
        "parse_contract",
        "validate_pipeline_chain",
        "format_pipeline_contracts",
        "print_pipeline",
        "Contract",
        "TensorSpec",
        "ContractViolation",
        "ContractParseError",
        "UncertaintyWeightedLoss",
        "CompositeLoss",
        "LossCalculator",
        "LossOutput",
        "MSELoss",
        "L1Loss",
        "CrossEntropyLoss",
        "PreProcessor",
        "PostProcessor",
        "Context",
        "Data",
        "Trainer",
        "diffusion",
    ]
    for name in names:
        assert getattr(ditty, name) is not None, name
    from ditty import diffusion

    assert diffusion.Scheduler is not None
    with pytest.raises(RecipeError, match="optimizer="):
        ditty.optimizers  # noqa: B018 - the original's module of optimizers: refused with what to use


HUB_TOKEN = "hf_PipelineTokenNeverOnDisk0123456789"
PUSH_SCRIPT = """
import sys, torch
sys.path.insert(0, {repo!r})
torch.set_num_threads(1)
from ditty import Pipeline, ModelFactory, MSELoss
from examples.custom_pipeline import Regressor, SplitTarget, make_rows
Pipeline(model_factory=ModelFactory.from_instance(Regressor()), dataset=make_rows(32), loss_calculator=MSELoss(),
         preprocessors=[SplitTarget()], output_dir={run!r}, max_steps=2, batch_size=8, log_every=1,
         push_to_hub=True, output_hub_repo="me/ported", hf_hub_token={token!r}, private_repo=True).run()
"""


def test_hf_hub_token_reaches_the_hub_and_is_written_nowhere(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.checkpoint.fake_hub import FakeHub

    hub = FakeHub().start()
    try:
        repo = Path(__file__).resolve().parents[2]
        run = tmp_path / "run"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
        env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf-home"))
        code = PUSH_SCRIPT.format(repo=str(repo), run=str(run), token=HUB_TOKEN)
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        hub.stop()
    assert hub.repos["me/ported"]["visibility"] == "private" and "model.safetensors" in hub.files["me/ported"]
    api_calls = [r for r in hub.requests if r.path.startswith(("/api/repos", "/api/models"))]
    assert api_calls and all(
        r.headers.get("authorization", r.headers.get("Authorization")) == f"Bearer {HUB_TOKEN}" for r in api_calls
    )
    for path in tmp_path.rglob("*"):  # recipe.toml, env.json, metrics.jsonl, the model card, checkpoints, HF_HOME
        if path.is_file():
            assert HUB_TOKEN.encode() not in path.read_bytes(), path
    assert HUB_TOKEN not in proc.stdout + proc.stderr
    listed = (run / "recipe.toml").read_text().split("\n\n")[0].splitlines()  # the header naming the objects
    assert any(line.startswith("# model: <python object Regressor>") for line in listed)
    assert not any("token" in line for line in listed)  # the objects listed in recipe.toml: not the token


def assert_adapter_only_trains(model, adapted: list[str], layers: int) -> None:
    """A peft model whose trainable tensors are exactly LoRA's A and B on the `adapted` modules."""
    from peft import PeftModel

    assert isinstance(model, PeftModel)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * len(adapted) * layers
    assert all("lora_A" in n or "lora_B" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == set(adapted)


def test_model_factory_build_puts_the_adapter_on_a_given_model(tiny_llama_dir):
    """ModelFactory(model=m, peft_config=...).build(): LoRA layers trainable, the base frozen; `m`
    itself untouched (the factory still hands it to a Pipeline, whose Trainer adds the adapter)."""
    from transformers import AutoModelForCausalLM

    from ditty import ModelFactory, PeftConfig

    given = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    factory = ModelFactory(model=given, peft_config=PeftConfig(enabled=True, r=4, target_modules=["q_proj", "o_proj"]))
    built = factory.build()
    assert_adapter_only_trains(built, adapted=["q_proj", "o_proj"], layers=2)
    assert built.peft_config["default"].r == 4
    assert all(p.requires_grad for p in given.parameters())
    assert not any("lora" in name for name, _ in given.named_modules())
    assert factory.base_model() is given
    ids = torch.arange(3, 19)[None]
    built(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is None for p in given.parameters())  # the copy trained, not `given`


def test_from_huggingface_with_4bit_quantization_lora_and_a_tokenizer_factory(tmp_path, tiny_llama_dir):
    from ditty import ModelFactory, PeftConfig, Pipeline, QuantConfig, TokenizerFactory
    from ditty.models.quant import quantized_linear_count

    ids = torch.arange(3, 35)
    samples = [{"input_ids": ids.roll(i), "labels": ids.roll(i)} for i in range(8)]
    model_factory = ModelFactory.from_huggingface(
        tiny_llama_dir,
        quant_config=QuantConfig(enabled=True, bits=4),
        peft_config=PeftConfig(enabled=True, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    # build() gives the model as the original's did: loaded in 4 bits, the adapter on, the base frozen.
    built = model_factory.build(device="cpu")
    assert quantized_linear_count(built)["Linear4bit"] == 14
    assert_adapter_only_trains(built, adapted=["q_proj", "v_proj"], layers=2)
    out = built(input_ids=ids[None], labels=ids[None])
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(p.grad is not None for p in built.parameters() if p.requires_grad)
    del built
    # The same factory then trains through a Pipeline (its Trainer loads the model again).
    pipeline = Pipeline(
        model_factory=model_factory,
        dataset=samples,
        tokenizer_factory=TokenizerFactory(tiny_llama_dir),
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        batch_size=4,
        lr=1e-3,
        log_every=1,
    )
    result = pipeline.run()
    assert result.steps == 2 and quantized_linear_count(pipeline.model)["Linear4bit"] == 14  # 7 per block
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").exists() and (final / "tokenizer.json").exists()
    assert '"q_proj"' in (final / "adapter_config.json").read_text()


def test_a_model_directory_without_a_tokenizer_trains_on_tensors_with_lora(tmp_path, tiny_llama_dir, caplog):
    """The original library's usage: ModelFactory.from_huggingface(DIR) with LoRA, DIR holding the
    weights and config only, the data already tensors. No tokenizer is needed: none is loaded."""
    import shutil

    from ditty import ModelFactory, PeftConfig, Pipeline

    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (Path(tiny_llama_dir) / name).exists():
            shutil.copy(Path(tiny_llama_dir) / name, weights_only / name)
    ids = torch.arange(3, 35)
    samples = [{"input_ids": ids.roll(i), "labels": ids.roll(i)} for i in range(8)]
    factory = ModelFactory.from_huggingface(
        str(weights_only), peft_config=PeftConfig(enabled=True, r=4, lora_alpha=8, target_modules=["q_proj"])
    )
    pipeline = Pipeline(
        model_factory=factory, dataset=samples, output_dir=str(tmp_path / "run"), max_steps=2, batch_size=4, lr=1e-3
    )
    result = pipeline.run()
    assert result.steps == 2
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").exists()
    assert not (final / "tokenizer.json").exists()  # there was none to save
    assert f"{final} has no tokenizer" in caplog.text and "partial" not in caplog.text, caplog.text


def test_token_ids_given_as_lists_train_one_row_per_sample(tmp_path, tiny_llama_dir):
    """Rows of token-id lists (a datasets.Dataset's form), not tensors: each sample is one row of the
    batch (torch's default_collate alone would give one tensor per position); ragged rows are a message."""
    from ditty import ModelFactory, Pipeline
    from ditty.config.errors import RecipeError

    ids = list(range(3, 35))
    samples = [{"input_ids": ids[i:] + ids[:i], "labels": ids[i:] + ids[:i]} for i in range(8)]
    result = Pipeline(
        model_factory=ModelFactory.from_huggingface(tiny_llama_dir), dataset=samples,
        output_dir=str(tmp_path / "run"), max_steps=2, batch_size=4, lr=1e-3, log_every=1, progress=False,
    ).run()  # fmt: skip
    assert result.steps == 2
    assert json.loads(open(f"{result.run_dir}/metrics.jsonl").readline())["tokens"] == 4  # samples of a step
    ragged = [{"input_ids": ids[: 20 + i], "labels": ids[: 20 + i]} for i in range(8)]
    with pytest.raises(RecipeError) as caught:
        Pipeline(
            model_factory=ModelFactory.from_huggingface(tiny_llama_dir), dataset=ragged,
            output_dir=str(tmp_path / "ragged"), max_steps=2, batch_size=4, lr=1e-3, progress=False,
        ).run()  # fmt: skip
    assert "different lengths" in str(caught.value) and "collate_fn=" in str(caught.value)
