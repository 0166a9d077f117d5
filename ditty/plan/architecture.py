"""A model's tensors, from its config alone: names, shapes and roles, without torch.

`ModelShape.from_config(config_dict)` lists every parameter tensor of a Hugging Face decoder of a
supported family (Llama-style blocks: llama, mistral, qwen2, qwen3, gemma, gemma2, granite) the way
`model.named_parameters()` would, so the planner can count bytes exactly (per dtype, per FSDP
shard, per optimizer state) for a 70B model in milliseconds. Other architectures and custom models
are listed from a meta-device build instead (`inventory_from_module`); tests check the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

TensorKind = Literal["linear", "embedding", "head", "norm", "bias", "other"]

# Families whose block is a Llama-style decoder layer; the value says what differs.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "granite": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
    "gemma": {"tied_default": True},
    "gemma2": {"tied_default": True, "sandwich_norms": True},
}

# transformers' config defaults for the fields the planner reads (the config classes'
# constructor defaults; tests/plan checks them against transformers). Used for random init from
# `model.architecture`, where there is no config.json to read.
CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    "mistral": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    ),
    "qwen2": dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
}


@dataclass(frozen=True)
class TensorSpec:
    """One parameter tensor as `named_parameters()` of the Hugging Face model names it."""

    name: str
    shape: tuple[int, ...]
    kind: TensorKind
    block: Optional[int] = None
    """Index of the decoder layer holding it; None for embeddings, final norm and head."""

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def module(self) -> str:
        """The owning module's path ("model.layers.0.self_attn.q_proj")."""
        return self.name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class ModelShape:
    """The sizes the planner needs, and the tensor inventory."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    tensors: tuple[TensorSpec, ...]
    checkpoint_dtype: Optional[str] = None
    """The dtype config.json says the weights are stored in ("bfloat16"), when it says."""
    source: str = ""
    """Where the config came from, for the report."""
    llama_block: bool = True
    """Whether the activation model (a Llama-style block) applies; False for architectures
    inventoried from a meta build, whose activations are only estimated."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def parameter_count(self) -> int:
        return sum(t.numel for t in self.tensors)

    def block_tensors(self, index: int = 0) -> list[TensorSpec]:
        return [t for t in self.tensors if t.block == index]

    @classmethod
    def from_config(cls, config: dict[str, Any], *, source: str = "") -> "ModelShape":
        """The shape of a supported family from its config.json values; KeyError for other families."""
        model_type = config.get("model_type", "")
        family = FAMILIES[model_type]
        values = {**CONFIG_DEFAULTS.get(model_type, {}), **{k: v for k, v in config.items() if v is not None}}
        hidden = int(values["hidden_size"])
        heads = int(values["num_attention_heads"])
        kv_heads = int(values.get("num_key_value_heads") or heads)
        head_dim = int(values.get("head_dim") or hidden // heads)
        tied = bool(values.get("tie_word_embeddings", family.get("tied_default", False)))
        shape = cls(
            model_type=model_type,
            vocab_size=int(values["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(values["intermediate_size"]),
            num_layers=int(values["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            tie_word_embeddings=tied,
            tensors=(),
            checkpoint_dtype=values.get("torch_dtype") or values.get("dtype"),
            source=source,
        )
        return _with_tensors(shape, family, values)


def _with_tensors(shape: ModelShape, family: dict[str, Any], values: dict[str, Any]) -> ModelShape:
    from dataclasses import replace

    h, i, v = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    q, kv, d = shape.q_dim, shape.kv_dim, shape.head_dim
    attention_bias = bool(values.get("attention_bias", False))
    qkv_bias = attention_bias or family.get("qkv_bias", False)
    mlp_bias = bool(values.get("mlp_bias", False))
    tensors = [TensorSpec("model.embed_tokens.weight", (v, h), "embedding")]
    for layer in range(shape.num_layers):
        p = f"model.layers.{layer}."
        block: list[tuple[str, tuple[int, ...], TensorKind]] = []
        for name, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            block.append((f"self_attn.{name}.weight", (out, h), "linear"))
            if qkv_bias:
                block.append((f"self_attn.{name}.bias", (out,), "bias"))
        block.append(("self_attn.o_proj.weight", (h, q), "linear"))
        if attention_bias:
            block.append(("self_attn.o_proj.bias", (h,), "bias"))
        if family.get("qk_norm"):
            block += [("self_attn.q_norm.weight", (d,), "norm"), ("self_attn.k_norm.weight", (d,), "norm")]
        for name, shape_ in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            block.append((f"mlp.{name}.weight", shape_, "linear"))
            if mlp_bias:
                block.append((f"mlp.{name}.bias", (shape_[0],), "bias"))
        norms = ["input_layernorm", "post_attention_layernorm"]
        if family.get("sandwich_norms"):
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        block += [(f"{name}.weight", (h,), "norm") for name in norms]
        tensors += [TensorSpec(p + name, shape_, kind, layer) for name, shape_, kind in block]
    tensors.append(TensorSpec("model.norm.weight", (h,), "norm"))
    if not shape.tie_word_embeddings:
        tensors.append(TensorSpec("lm_head.weight", (v, h), "head"))
    return replace(shape, tensors=tuple(tensors))


def inventory_from_module(model: Any, *, source: str = "", checkpoint_dtype: Optional[str] = None) -> ModelShape:
    """The inventory of a built (meta-device) torch module: any architecture, custom models too.

    Roles come from the module types: `nn.Linear` weights are "linear" (the output embedding is
    "head"), `nn.Embedding` weights "embedding", 1-D parameters of other modules "norm"/"bias".
    Blocks are the repeated `_no_split_modules` (or, without them, none are known). Tied
    parameters appear once, as `named_parameters()` lists them.
    """
    from torch import nn

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    owners: dict[str, tuple[nn.Module, Optional[int]]] = {}
    block_index = -1
    current_block: Optional[str] = None
    for name, module in model.named_modules():
        if type(module).__name__ in block_names:
            block_index += 1
            current_block = name + "."
        in_block = current_block is not None and name.startswith(current_block)
        owners[name] = (module, block_index if in_block else None)
    tensors = []
    for name, parameter in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        module, block = owners.get(module_name, (None, None))
        if module is not None and module is head:
            kind: TensorKind = "head"
        elif isinstance(module, nn.Linear) and leaf == "weight":
            kind = "linear"
        elif isinstance(module, nn.Embedding):
            kind = "embedding"
        elif leaf == "bias":
            kind = "bias"
        elif parameter.dim() == 1:
            kind = "norm"
        else:
            kind = "other"
        tensors.append(TensorSpec(name, tuple(parameter.shape), kind, block))
    config = getattr(model, "config", None)

    def size(*names: str, default: int = 0) -> int:
        for n in names:
            value = getattr(config, n, None)
            if isinstance(value, int):
                return value
        return default

    hidden = size("hidden_size", "n_embd", "d_model")
    heads = size("num_attention_heads", "n_head", default=1)
    return ModelShape(
        model_type=getattr(config, "model_type", type(model).__name__),
        vocab_size=size("vocab_size"),
        hidden_size=hidden,
        intermediate_size=size("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden),
        num_layers=max(block_index + 1, 0),
        num_heads=heads,
        num_kv_heads=size("num_key_value_heads", default=heads),
        head_dim=size("head_dim", default=hidden // max(heads, 1)),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        tensors=tuple(tensors),
        checkpoint_dtype=checkpoint_dtype,
        source=source,
        llama_block=False,
    )
