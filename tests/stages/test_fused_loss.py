"""The chunked cross-entropy (ditty.fused_loss): the same loss and gradients as the full-logits path
(CausalLMLoss), for every verified model type, with LoRA (frozen, trainable, LoRA-wrapped, tied
head), through the Trainer, and without ever allocating the [tokens, vocab] logits."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

from ditty.config.errors import RecipeError
from ditty.fused_loss import (
    VERIFIED_MODEL_TYPES,
    FusedLinearCrossEntropyLoss,
    Projection,
    fused_linear_cross_entropy,
    resolve_backend,
)
from ditty.loss import CausalLMLoss
from ditty.processors import Context
from ditty.train.pipeline import StageChain, run_pipeline

TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)
TOLERANCE = 1e-5


def tiny(model_type: str = "llama", **overrides):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**TINY, **overrides}))


def batch(rows: int = 2, width: int = 24) -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 300, (rows, width), generator=generator)
    labels = ids.clone()
    labels[:, :6] = -100  # a prompt that takes no loss
    return {"input_ids": ids, "labels": labels}


def loss_and_grads(model, loss, data) -> tuple[float, int, dict]:
    """One micro-batch through ditty's pipeline, then backward of the per-token sum."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)  # the same dropout masks for both losses
    out = run_pipeline(StageChain([], [], loss), model, data, Context(model=model), contextlib.nullcontext)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.loss.item(), int(out.num_tokens), grads


def assert_same(model, data=None, chunks: int = 3):
    data = data or batch()
    full = loss_and_grads(model, CausalLMLoss(), data)
    chunked = loss_and_grads(model, FusedLinearCrossEntropyLoss(chunks=chunks), data)
    assert full[1] == chunked[1] > 0
    assert abs(full[0] - chunked[0]) / full[1] < TOLERANCE  # per-token loss
    assert full[2].keys() == chunked[2].keys() and full[2]
    for name in full[2]:
        assert (full[2][name] - chunked[2][name]).abs().max() < TOLERANCE, name


# ---------------------------------------------------------------------------------- the kernel


@pytest.mark.parametrize("softcap, scale, bias", [(None, 1.0, False), (3.0, 1.0, True), (None, 0.25, False)])
def test_kernel_matches_cross_entropy_of_the_full_logits(softcap, scale, bias):
    torch.manual_seed(0)
    hidden = torch.randn(70, 16, requires_grad=True)
    weight = torch.randn(500, 16, requires_grad=True)
    b = torch.randn(500, requires_grad=True) if bias else None
    target = torch.randint(0, 500, (70,))
    target[::5] = -100
    logits = F.linear(hidden * scale, weight, b)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    reference = F.cross_entropy(logits, target, ignore_index=-100, reduction="sum")
    expected = torch.autograd.grad(reference, [hidden, weight] + ([b] if bias else []))
    total, count = fused_linear_cross_entropy(hidden, Projection(weight, b, scale, softcap), target, chunks=4)
    got = torch.autograd.grad(total * 1.0, [hidden, weight] + ([b] if bias else []))
    assert int(count) == int((target != -100).sum())
    assert abs(total.item() - reference.item()) < 1e-4 * reference.item()
    for a, e in zip(got, expected):
        assert (a - e).abs().max() < 1e-4


def test_kernel_without_targets_or_gradients():
    hidden, weight = torch.randn(4, 8, requires_grad=True), torch.randn(20, 8, requires_grad=True)
    total, count = fused_linear_cross_entropy(hidden, Projection(weight), torch.full((4,), -100))
    total.backward()
    assert total.item() == 0 and int(count) == 0 and weight.grad.abs().sum() == 0
    with torch.no_grad():  # evaluation: the loss alone, no gradient buffers
        total, _ = fused_linear_cross_entropy(hidden, Projection(weight), torch.arange(4))
    assert total.item() > 0 and not total.requires_grad


def test_backend_choice_on_the_cpu():
    assert resolve_backend("auto", "cpu") == "chunked"
    with pytest.raises(RecipeError, match="needs CUDA"):
        resolve_backend("liger", "cpu")


def test_cce_is_chosen_only_where_the_head_computes_in_half_precision(monkeypatch):
    """cut-cross-entropy's backward asserts bf16/fp16 inputs (it failed so under bf16 autocast on an
    H200, where the final norm's output is fp32): autocast's dtype counts as half, fp32 training does not."""
    from ditty.stages.fused_loss import kernels

    monkeypatch.setattr(kernels, "backend_installed", lambda backend: backend in ("chunked", "cce"))
    assert resolve_backend("auto", "cuda", half_precision=True) == "cce"
    assert resolve_backend("auto", "cuda", half_precision=False) == "chunked"
    with pytest.raises(RecipeError, match="bf16 or fp16"):
        resolve_backend("cce", "cuda", half_precision=False)
    hidden = torch.zeros(2, 4)
    assert kernels.half_dtype(hidden) is None and kernels.half_dtype(hidden.bfloat16()) == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.half_dtype(hidden) == torch.bfloat16


# ---------------------------------------------------------------------------------- models


@pytest.mark.parametrize(
    "model_type, overrides",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True}),
        ("cohere", {"logit_scale": 0.25}),  # logits scaled
        ("granite", {"logits_scaling": 4.0}),  # logits divided
        ("gemma2", {"final_logit_softcapping": 3.0}),  # logits softcapped
        ("gpt2", {}),  # a bias-free head with dropout in the model
    ],
)
def test_same_loss_and_gradients_as_the_full_logits(model_type, overrides):
    assert_same(tiny(model_type, **overrides))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(VERIFIED_MODEL_TYPES))
def test_every_verified_model_type(model_type):
    assert_same(tiny(model_type))


def _lora(model, **options):
    from peft import LoraConfig, get_peft_model

    options.setdefault("target_modules", "all-linear")
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, **options))


def _train_lora_b(model):
    """LoRA's B starts at zero; give it values so the adapter changes the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return model


@pytest.mark.parametrize(
    "case",
    ["frozen head", "trainable head (modules_to_save)", "LoRA on the head", "tied, frozen head"],
)
def test_lora(case):
    if case == "frozen head":
        model = _lora(tiny())
    elif case == "trainable head (modules_to_save)":
        model = _lora(tiny(), modules_to_save=["lm_head"])
    elif case == "LoRA on the head":
        model = _lora(tiny(), target_modules=["q_proj", "v_proj", "lm_head"])
    else:
        model = _lora(tiny(tie_word_embeddings=True))
    assert_same(_train_lora_b(model))


def test_the_full_logits_are_never_allocated():
    """No tensor of tokens x vocab elements in the forward or backward: the largest is one chunk of
    logits (512 tokens in 8 chunks; parameter-sized buffers, 4,096 x 32, are 16x smaller)."""
    model = tiny(vocab_size=4096, hidden_size=32, intermediate_size=64)
    data = batch(rows=4, width=128)
    full_logits = 4 * 128 * 4096

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    with Largest():
        loss_and_grads(model, FusedLinearCrossEntropyLoss(chunks=8), data)
    assert Largest.largest <= full_logits // 8
    with Largest():  # the control: the full-logits path does allocate them
        loss_and_grads(model, CausalLMLoss(), data)
    assert Largest.largest >= full_logits


def test_original_ditty_style_hidden_and_weight_from_the_output():
    """A custom model returning (hidden, weight): hidden_index / weight_index name them."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 50, bias=False)

        def forward(self, x):
            return self.body(x), self.head.weight

    torch.manual_seed(0)
    net, x = Net(), torch.randn(2, 5, 8)
    target = torch.randint(0, 50, (2, 5))
    loss = FusedLinearCrossEntropyLoss(hidden_index=0, weight_index=1, target_key="target", chunks=2)
    out = loss(net(x), Context(target=target, model=net))
    hidden = net.body(x)
    reference = F.cross_entropy(net.head(hidden).flatten(0, 1), target.flatten(), reduction="sum")
    assert abs(out.loss.item() - reference.item()) < 1e-4 and int(out.num_tokens) == 10
    by_path = FusedLinearCrossEntropyLoss(hidden_index=0, weight_attr_path="head.weight", target_key="target")
    assert abs(by_path(net(x), Context(target=target, model=net)).loss.item() - reference.item()) < 1e-4


# ---------------------------------------------------------------------------------- the trainer


def test_trainer_with_loss_chunks_matches_full_logits(tmp_path, tiny_llama_dir):
    from ditty.train import Trainer
    from tests.train.helpers import read_jsonl, small_config, write_prompt_completion

    data = write_prompt_completion(tmp_path / "pc.jsonl")
    full = small_config(tmp_path / "full", tiny_llama_dir, data, steps=3)
    chunked = replace(full, run=replace(full.run, output_dir=str(tmp_path / "chunked" / "run")))
    chunked = replace(chunked, train=replace(chunked.train, loss_chunks=4))
    runs = [Trainer(config).train() for config in (full, chunked)]
    losses = [[r["loss"] for r in read_jsonl(f"{run.run_dir}/metrics.jsonl")] for run in runs]
    assert len(losses[0]) == 3 and max(abs(a - b) for a, b in zip(*losses)) < TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["liger", "cce"])
def test_gpu_backends_match_the_chunked_one(backend):
    pytest.importorskip({"liger": "liger_kernel", "cce": "cut_cross_entropy"}[backend])
    torch.manual_seed(0)
    hidden = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 1000, (256,), device="cuda")
    results = {}
    for name in ("chunked", backend):
        total, count = fused_linear_cross_entropy(hidden, Projection(weight), target, backend=name)
        grads = torch.autograd.grad(total, [hidden, weight])
        results[name] = (total.item() / int(count), [g.float() for g in grads])
    assert abs(results["chunked"][0] - results[backend][0]) < 1e-2
    for a, b in zip(results["chunked"][1], results[backend][1]):
        assert (a - b).abs().max() < 5e-2 * a.abs().max()
