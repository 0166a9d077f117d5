"""LoRA, DoRA and QLoRA through `LoraConverter` on tiny local Llama and Mistral models, and on a
custom nn.Module: what gets built, that it trains, and that the base stays frozen and unchanged."""

from __future__ import annotations

import warnings

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.config.sections import ModelConfig, PeftConfig, QuantConfig
from ditty.models import build_model
from ditty.models.adapters import LoraConverter, adapted_module_names, trainable_parameter_counts
from ditty.models.converters import ModelConverter, apply_converters
from ditty.models.quant import quantized_linear_count

LAYERS = 2  # the conftest models
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# kind -> (peft section, quant section, the module names it must adapt in each layer)
SETUPS = {
    "lora": (
        PeftConfig(kind="lora", r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
        QuantConfig(),
        ("q_proj", "v_proj"),
    ),
    "dora": (PeftConfig(kind="dora", r=4, alpha=8, target_modules="all-linear"), QuantConfig(), ALL_LINEAR),
    "qlora": (
        PeftConfig(kind="lora", r=4, alpha=8, target_modules="all-linear"),
        QuantConfig(kind="bnb-4bit"),
        ALL_LINEAR,
    ),
}


def batch(seed: int = 0, size: tuple[int, int] = (4, 24)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 259, size, generator=generator)  # byte-tokenizer ids, no specials


def train_steps(model: torch.nn.Module, ids: torch.Tensor, steps: int = 6, lr: float = 1e-2) -> list[float]:
    """A bare loop on one fixed batch with the model's own causal-LM loss: it must overfit."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bitsandbytes' per-call dtype notes
        for _ in range(steps):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    return losses


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(input_ids=ids).logits


def frozen_base_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every frozen tensor, 4-bit scales (absmax) included."""
    snapshot = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            snapshot[name] = parameter.detach().clone()
            quant_state = getattr(parameter, "quant_state", None)
            if quant_state is not None:
                snapshot[name + ".absmax"] = quant_state.absmax.clone()
    return snapshot


def build_adapted(model_dir: str, kind: str) -> torch.nn.Module:
    peft_cfg, quant, _ = SETUPS[kind]
    torch.manual_seed(0)  # adapter init
    base = build_model(ModelConfig(path=model_dir), quant=quant)
    return apply_converters(base, [LoraConverter(peft_cfg)])


@pytest.fixture(params=["llama", "mistral"])
def model_dir(request, tiny_llama_dir, tiny_mistral_dir):
    return {"llama": tiny_llama_dir, "mistral": tiny_mistral_dir}[request.param]


@pytest.mark.parametrize("kind", list(SETUPS))
def test_adapter_trains_on_its_targets_with_the_base_frozen_and_unchanged(model_dir, kind):
    peft_cfg, quant, targets = SETUPS[kind]
    model = build_adapted(model_dir, kind)

    attention = ("q_proj", "k_proj", "v_proj", "o_proj")
    expected = {
        f"base_model.model.model.layers.{i}.{'self_attn' if t.endswith(attention) else 'mlp'}.{t}"
        for i in range(LAYERS)
        for t in targets
    }
    assert set(adapted_module_names(model)) == expected  # exactly the targets; never lm_head
    counts = quantized_linear_count(model)
    assert counts["Linear4bit"] == (LAYERS * len(ALL_LINEAR) if quant.kind == "bnb-4bit" else 0)
    assert counts["Linear8bitLt"] == 0
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in name for name in trainable)
    if kind == "dora":
        assert any("lora_magnitude_vector" in name for name in trainable)
    else:
        assert not any("lora_magnitude_vector" in name for name in trainable)

    before = frozen_base_snapshot(model)
    losses = train_steps(model, batch())
    assert losses[-1] < losses[0] - 0.1, losses
    after = frozen_base_snapshot(model)
    assert before.keys() == after.keys()
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert not changed, f"frozen base tensors changed in training: {changed[:3]}"


def test_parameter_counts_see_through_4bit_packing(tiny_llama_dir):
    """A 4-bit weight stores two values per byte: counts must not halve when quantized."""
    full = build_adapted(tiny_llama_dir, "dora")
    peft_cfg = SETUPS["dora"][0]
    torch.manual_seed(0)
    quantized = apply_converters(
        build_model(ModelConfig(path=tiny_llama_dir), quant=QuantConfig(kind="bnb-4bit")), [LoraConverter(peft_cfg)]
    )
    assert trainable_parameter_counts(quantized) == trainable_parameter_counts(full)
    trainable, total = trainable_parameter_counts(full)
    assert (trainable, total) == full.get_nb_trainable_parameters()  # peft's own count agrees
    # DoRA on all 7 linears of 2 layers: rank-4 A and B plus one magnitude per output feature.
    shapes = {
        "q_proj": (64, 64),
        "k_proj": (64, 32),
        "v_proj": (64, 32),
        "o_proj": (64, 64),
        "gate_proj": (64, 128),
        "up_proj": (64, 128),
        "down_proj": (128, 64),
    }
    assert trainable == LAYERS * sum(4 * (i + o) + o for i, o in shapes.values())


def test_unknown_target_is_a_recipe_error_naming_real_modules(tiny_llama_dir):
    base = build_model(ModelConfig(path=tiny_llama_dir))
    with pytest.raises(RecipeError) as error:
        LoraConverter(PeftConfig(kind="lora", target_modules=["q_projection"])).convert(base)
    problem = error.value.problems[0]
    assert problem.key == "peft.target_modules"
    assert "q_proj" in problem.fix


def test_misspelled_modules_to_save_is_a_recipe_error_not_silence(tiny_llama_dir):
    base = build_model(ModelConfig(path=tiny_llama_dir))
    with pytest.raises(RecipeError) as error:
        LoraConverter(PeftConfig(kind="lora", target_modules=["q_proj"], modules_to_save=["lm_hed"])).convert(base)
    problem = error.value.problems[0]
    assert problem.key == "peft.modules_to_save"
    assert '"lm_head"' in problem.fix


def test_modules_to_save_trains_a_full_copy(tiny_llama_dir):
    base = build_model(ModelConfig(path=tiny_llama_dir))
    model = LoraConverter(PeftConfig(kind="lora", r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])).convert(
        base
    )
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any(name.endswith("lm_head.modules_to_save.default.weight") for name in trainable)
    assert not any("original_module" in name for name in trainable)


class TinyMLP(torch.nn.Module):
    """A model that is not a transformers model: peft finds its layers by module name."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU())
        self.hidden = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(self.encoder(x))))


def test_lora_on_a_custom_module_targets_by_name_and_trains():
    torch.manual_seed(0)
    mlp = TinyMLP()
    original = {name: t.clone() for name, t in mlp.state_dict().items()}
    converter = LoraConverter(PeftConfig(kind="lora", r=4, alpha=8, target_modules=["hidden", "encoder.0"]))
    assert isinstance(converter, ModelConverter) and converter.name == "lora"
    model = apply_converters(mlp, [converter])
    assert sorted(adapted_module_names(model)) == ["base_model.model.encoder.0", "base_model.model.hidden"]

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True).sin()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    base_now = {
        name.replace("base_layer.", ""): t
        for name, t in model.get_base_model().state_dict().items()
        if "lora_" not in name
    }
    assert base_now.keys() == original.keys()
    assert all(torch.equal(base_now[name], original[name]) for name in original)


def test_all_linear_on_a_custom_module_adapts_every_linear():
    model = LoraConverter(PeftConfig(kind="lora", r=2)).convert(TinyMLP())
    assert sorted(adapted_module_names(model)) == [
        "base_model.model.encoder.0",
        "base_model.model.head",
        "base_model.model.hidden",
    ]
