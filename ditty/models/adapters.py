"""LoRA and DoRA adapters through peft, as a `ModelConverter`, and honest parameter counts.

`LoraConverter(peft_cfg).convert(model)` runs after the weights are loaded (peft wraps the real
layers, bitsandbytes-quantized ones included) and before the model is parallelized. It returns a
peft model whose only trainable parameters are the adapters and `peft.modules_to_save`.

Targets are module names as peft matches them: an entry matches a module whose name is that
entry or ends with "." + entry ("q_proj" matches "model.layers.0.self_attn.q_proj"), so custom
(non Hugging Face) `nn.Module`s work the same way. "all-linear" means every `nn.Linear` except,
on Hugging Face models, the output head; on a custom module it is every `nn.Linear`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ditty.config.errors import RecipeError
from ditty.config.sections import PeftConfig

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig


class LoraConverter:
    """Wrap the targeted layers of a model in LoRA (peft.kind = "lora") or DoRA ("dora") adapters.

    A base loaded in 4 or 8 bits is first prepared by `prepare_quantized_for_training` (frozen; its
    non-quantized fp16/bf16 parameters upcast to fp32 unless `upcast_quantized = False`, which the
    trainer must pass under FSDP, where a block's parameters must share one dtype).
    """

    name = "lora"

    def __init__(self, peft_cfg: PeftConfig, *, upcast_quantized: bool = True, task: str = "causal-lm") -> None:
        if peft_cfg.kind not in ("lora", "dora"):
            raise ValueError(f"LoraConverter needs peft.kind lora or dora, not {peft_cfg.kind!r}")
        self.peft_cfg = peft_cfg
        self.upcast_quantized = upcast_quantized
        self.task = task
        self.name = peft_cfg.kind

    def lora_config(self, model: "torch.nn.Module") -> "LoraConfig":
        """The peft `LoraConfig` for `model`. Hugging Face models get the task's peft task type
        (`model.task`: CAUSAL_LM, SEQ_CLS, ...), so the saved adapter loads with the task's
        `AutoPeftModelFor...`; a task with a head (a classifier) also trains the head fully
        (`task_head_modules`), as peft does for its SEQ_CLS heads."""
        from peft import LoraConfig
        from transformers import PreTrainedModel

        from ditty.models.tasks import model_task

        cfg = self.peft_cfg
        targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
        hf_model = isinstance(model, PreTrainedModel)
        task = model_task(self.task)
        head = [name for name in task_head_modules(model, task) if name not in cfg.modules_to_save]
        to_save = list(cfg.modules_to_save) + head
        return LoraConfig(
            r=cfg.r,
            lora_alpha=int(cfg.alpha) if float(cfg.alpha).is_integer() else cfg.alpha,
            lora_dropout=cfg.dropout,
            target_modules=targets,
            modules_to_save=to_save or None,
            use_dora=cfg.kind == "dora",
            task_type=task.peft_task_type if hf_model else None,
        )

    def convert(self, model: "torch.nn.Module") -> "torch.nn.Module":
        from peft import get_peft_model

        from ditty.models.quant import prepare_quantized_for_training

        if is_loaded_quantized(model):
            model = prepare_quantized_for_training(model, upcast_to_fp32=self.upcast_quantized)
        config = self.lora_config(model)
        try:
            adapted = get_peft_model(model, config)
        except ValueError as error:
            message = str(error)
            if "not found in the base model" not in message:
                raise
            raise RecipeError.single(
                f"peft found no module to adapt: {message.splitlines()[0]}",
                key="peft.target_modules",
                fix="use module names of this model (its linear layers include "
                f'{_some_linear_names(model)}), or "all-linear"',
            ) from error
        _check_modules_to_save(adapted, self.peft_cfg.modules_to_save)
        return adapted


def task_head_modules(model: "torch.nn.Module", task) -> list[str]:
    """The modules of a task head that must train fully beside an adapter: for a task with a head, the
    top-level modules with parameters outside the base model (BERT's classifier, DistilBERT's
    pre_classifier and classifier, DeBERTa's pooler), plus the modules of any weight the load
    initialised anew (BERT's pooler when the checkpoint lacks it). Nothing for other tasks or models."""
    from ditty.models.task_support import head_modules

    prefix = getattr(model, "base_model_prefix", None)
    if not task.head or not prefix:
        return []
    top = [name for name, child in model.named_children() if name != prefix and any(True for _ in child.parameters())]
    new = [m for m in head_modules(getattr(model, "ditty_new_head", ())) if m.split(".", 1)[0] == prefix]
    return top + new


def is_loaded_quantized(model: "torch.nn.Module") -> bool:
    """True for a transformers model loaded in 4 or 8 bits by bitsandbytes."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def adapted_module_names(model: "torch.nn.Module") -> list[str]:
    """Names (relative to the peft model) of the modules that carry a LoRA/DoRA adapter."""
    from peft.tuners.lora import LoraLayer

    return [name for name, module in model.named_modules() if isinstance(module, LoraLayer)]


def parameter_numel(parameter: "torch.Tensor") -> int:
    """How many model parameters a tensor holds. A bitsandbytes 4-bit `Params4bit` packs two
    4-bit values per byte into a flat tensor of its storage dtype, so its `numel()` undercounts:
    the original shape is in its quant state (before quantization, numel is already the truth).
    8-bit `Int8Params` store one value per element, so numel is right."""
    quant_state = getattr(parameter, "quant_state", None)
    if type(parameter).__name__ == "Params4bit":
        if quant_state is not None:
            return int(quant_state.shape.numel())
        if getattr(parameter, "bnb_quantized", False):  # packed but the state is elsewhere
            return parameter.numel() * parameter.element_size() * 2
    return parameter.numel()


def trainable_parameter_counts(model: "torch.nn.Module") -> tuple[int, int]:
    """(trainable, total) parameters, counting 4-bit packed weights at their real size.

    Shared (tied) parameters count once. With `peft.modules_to_save`, the frozen original and its
    trainable copy both exist in memory and both count in `total`. This is what env.json and the
    start-of-run log report; peft's `print_trainable_parameters` agrees for LoRA and 4-bit bases.
    """
    seen: set[int] = set()
    trainable = total = 0
    for parameter in model.parameters():
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        count = parameter_numel(parameter)
        total += count
        if parameter.requires_grad:
            trainable += count
    return trainable, total


def _check_modules_to_save(model: "torch.nn.Module", wanted: list[str]) -> None:
    """peft skips a `modules_to_save` entry that matches nothing, silently: a typo would leave the
    embeddings frozen while the recipe says they train."""
    from peft.utils import ModulesToSaveWrapper

    wrapped = [name for name, module in model.named_modules() if isinstance(module, ModulesToSaveWrapper)]
    missing = [entry for entry in wanted if not any(name == entry or name.endswith("." + entry) for name in wrapped)]
    if missing:
        children = sorted({name.rsplit(".", 1)[-1] for name, _ in model.get_base_model().named_modules() if name})
        from ditty.models.source import did_you_mean

        raise RecipeError.single(
            f"no module of the model is named {missing[0]!r}, so it would not be trained",
            key="peft.modules_to_save",
            fix=did_you_mean(missing[0], children, what="use module names such as embed_tokens or lm_head"),
        )


def _some_linear_names(model: "torch.nn.Module", limit: int = 6) -> str:
    import torch

    names = sorted(
        {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    )
    return ", ".join(names[:limit]) or "none"
