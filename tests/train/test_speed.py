"""FP8 (torchao, emulated), activation checkpointing and torch.compile train for real and match eager.

Each test checks the rewrite is really in the model (Float8Linear, checkpoint wrappers, compiled
blocks), so a silent fallback to the plain path cannot pass.
"""

from __future__ import annotations

import pytest
import torch

from ditty.models.float8 import float8_modules
from ditty.parallel.speed import checkpointed_modules, compiled_modules
from tests.train.speed_helpers import tiny_config, train


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    return train(tiny_config(tmp_path_factory.mktemp("eager")))[1]


def test_fp8_emulated_trains_with_float8_linears(tmp_path):
    trainer, losses = train(tiny_config(tmp_path, steps=6, fp8=dict(enabled=True, emulate=True)))
    converted = float8_modules(trainer.model)
    # 4 blocks x (q, k, v, o, gate, up, down); lm_head (vocabulary dim) stays in high precision.
    assert len(converted) == 28, [type(m).__name__ for m in converted]
    assert all(type(m).__name__ == "Float8Linear" for m in converted)
    assert type(trainer.model.lm_head) is torch.nn.Linear
    assert losses[-1] < losses[0] - 0.2, losses


def test_fp8_on_lora_converts_the_frozen_base_layers_but_not_the_adapters(tmp_path):
    # r = 16 so that lora_A (128 -> 16) and lora_B (16 -> 128) have float8-compatible sizes: only the
    # adapter filter keeps them out, not the multiple-of-16 rule.
    peft = dict(kind="lora", r=16, alpha=32.0, target_modules="all-linear")
    trainer, losses = train(
        tiny_config(tmp_path, steps=6, peft=peft, fp8=dict(enabled=True, emulate=True), optimizer=dict(lr=1e-2))
    )
    names = {name: module for name, module in trainer.model.named_modules()}
    converted = [name for name, module in names.items() if type(module).__name__ == "Float8Linear"]
    # 4 blocks x 7 projections, each peft's frozen base_layer; lm_head is not adapted by "all-linear"
    assert len(converted) == 28 and all(name.endswith(".base_layer") for name in converted), converted
    adapters = [name for name, module in names.items() if ".lora_A." in name or ".lora_B." in name]
    assert len(adapters) == 56 and all(type(names[name]) is torch.nn.Linear for name in adapters)
    assert all(not names[name].weight.requires_grad for name in converted)  # still frozen: no optimizer state
    trainable = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert trainable and not any(id(names[name].weight) in trainable for name in converted)
    assert losses[-1] < losses[0] - 0.2, losses


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_same_losses(tmp_path, eager, mode):
    trainer, losses = train(tiny_config(tmp_path, train=dict(activation_checkpointing=mode)))
    wrappers = checkpointed_modules(trainer.model)
    assert len(wrappers) == 4 and all(
        type(w._checkpoint_wrapped_module).__name__ == "LlamaDecoderLayer" for w in wrappers
    )
    assert losses == pytest.approx(eager, rel=1e-5, abs=1e-5)
    # the saved model keeps plain keys: the wrapper's prefix is stripped from the state dict
    assert not any("_checkpoint_wrapped_module" in k for k in trainer.model.state_dict())


def _compiled_run(tmp_path, scope: str, **train_changes):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    trainer, losses = train(tiny_config(tmp_path, train=dict(compile=True, compile_scope=scope, **train_changes)))
    return trainer, losses, counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_compile_blocks_same_losses(tmp_path, eager):
    trainer, losses, graphs = _compiled_run(tmp_path, "blocks")
    blocks = compiled_modules(trainer.model)
    assert len(blocks) == 4 and all(type(b).__name__ == "LlamaDecoderLayer" for b in blocks)
    assert graphs > 0  # dynamo really produced graphs (an eager fallback produces none)
    assert losses == pytest.approx(eager, rel=1e-4, abs=1e-4)


@pytest.mark.slow
def test_compile_model_same_losses(tmp_path, eager):
    trainer, losses, graphs = _compiled_run(tmp_path, "model")
    assert compiled_modules(trainer.model) == [trainer.model] and graphs > 0
    assert losses == pytest.approx(eager, rel=1e-4, abs=1e-4)


@pytest.mark.slow
def test_compile_with_activation_checkpointing(tmp_path, eager):
    trainer, losses, graphs = _compiled_run(tmp_path, "blocks", activation_checkpointing="full")
    blocks = compiled_modules(trainer.model)
    assert len(blocks) == 4 and blocks == checkpointed_modules(trainer.model) and graphs > 0
    assert trainer.compile_report.graphs > 0 and not trainer.compile_report.fell_back
    assert losses == pytest.approx(eager, rel=1e-4, abs=1e-4)


class _NoBlocks(torch.nn.Module):
    """A custom model that declares no blocks (no _no_split_modules): embeddings, a list of layers, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.act = torch.nn.GELU()
        self.head = torch.nn.Linear(8, 3)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = self.act(layer(h))
        return self.head(h)


def test_activation_checkpointing_a_custom_model_checkpoints_its_children():
    from ditty.parallel.speed import apply_activation_checkpointing
    from ditty.parallel.wrap import find_blocks

    torch.manual_seed(0)
    plain, ids = _NoBlocks(), torch.randint(0, 10, (2, 5))
    wrapped = _NoBlocks()
    wrapped.load_state_dict(plain.state_dict())
    wrapped.add_module("ditty_loss", torch.nn.Linear(1, 1))  # a loss's parameters: never called in forward
    apply_activation_checkpointing(wrapped, "full")
    inner = [type(m._checkpoint_wrapped_module).__name__ for m in checkpointed_modules(wrapped)]
    assert inner == ["Embedding", "Linear", "Linear", "Linear"]  # the list's layers, the head; not act or ditty_loss
    assert wrapped.state_dict().keys() == {**plain.state_dict(), "ditty_loss.weight": 0, "ditty_loss.bias": 0}.keys()
    plain(ids).square().sum().backward()
    wrapped(ids).square().sum().backward()
    for (name, a), b in zip(plain.named_parameters(), [p for n, p in wrapped.named_parameters() if "loss" not in n]):
        assert torch.allclose(a.grad, b.grad), name
    # Declared blocks still win; sharding (no or_children) still asks for them.
    assert find_blocks(_NoBlocks(), names=["Linear"], or_children=True)[0] is not None
    with pytest.raises(Exception, match="declares no blocks"):
        find_blocks(_NoBlocks())


def test_activation_checkpointing_looks_through_a_peft_wrapper():
    from ditty.config.sections import PeftConfig
    from ditty.models.adapters import LoraConverter
    from ditty.parallel.wrap import model_children

    model = LoraConverter(PeftConfig(kind="lora", r=2, target_modules=["head"])).convert(_NoBlocks())
    names = [type(m).__name__ for m in model_children(model)]
    assert names == ["Embedding", "Linear", "Linear", "Linear"], names
