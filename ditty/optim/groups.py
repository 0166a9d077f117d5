"""Parameter groups: which tensors decay, which learning-rate factor each gets, which go to Muon.

One set of rules over (name, shape, role) records, so the optimizer builder (over a real module)
and the planner (over a model's tensor inventory, without torch) group the same tensors the same
way, and `ditty check` can print the groups the run will build.

Roles come from the module types, as the planner's inventory names them: "embedding" (an
`nn.Embedding`, and a head tied to it), "head" (the model's output embedding), "bias", "norm"
(every other 1-D parameter: norm scales, DoRA magnitudes), "linear" (an `nn.Linear` weight) and
"other". A pattern in `optimizer.no_decay` / `optimizer.lr_multipliers` is a role word or a regular
expression searched in the parameter name.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from ditty.config.errors import Problem
from ditty.config.sections import OptimizerConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger("ditty.optim")

ROLE_WORDS = ("bias", "norm", "embedding", "head")
"""Patterns that name a role rather than a regular expression."""

# A numeric path segment ("model.layers.3.", "encoder.layer.0.", "h.11.") marks a tensor inside the
# repeated blocks: the hidden layers Muon is meant for. Embeddings, the output head, a classifier
# and the final norm sit outside them.
_BLOCK_INDEX = re.compile(r"(^|\.)\d+\.")


@dataclass(frozen=True)
class ParamInfo:
    """A trainable parameter as the grouping rules see it."""

    name: str
    shape: tuple[int, ...]
    role: str

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass
class Group:
    """One parameter group: the algorithm that updates it, decay on or off, its lr factor."""

    algorithm: str
    decay: bool
    lr_factor: float
    names: list[str] = field(default_factory=list)
    numel: int = 0

    @property
    def key(self) -> tuple[str, bool, float]:
        return (self.algorithm, self.decay, self.lr_factor)

    def describe(self) -> str:
        tensors = f"{len(self.names)} tensor{'s' if len(self.names) != 1 else ''}"
        factor = f", lr x{self.lr_factor:g}" if self.lr_factor != 1.0 else ""
        decay = "decay" if self.decay else "no decay"
        return f"{self.algorithm}, {decay}{factor}: {tensors}, {self.numel:,} parameters"


def takes_muon(info: ParamInfo) -> bool:
    """Muon updates the 2-D weights inside the repeated blocks (LoRA adapter matrices included);
    embeddings, the head, classifiers, norms, biases and 1-D / 3-D+ tensors go to AdamW."""
    return len(info.shape) == 2 and info.role not in ("embedding", "head") and bool(_BLOCK_INDEX.search(info.name))


def matches(pattern: str, info: ParamInfo) -> bool:
    if pattern in ROLE_WORDS:
        return info.role == pattern
    return re.search(pattern, info.name) is not None


def lr_factor(info: ParamInfo, multipliers: dict[str, float]) -> float:
    for pattern, factor in multipliers.items():
        if matches(pattern, info):
            return float(factor)
    return 1.0


def group_parameters(infos: Iterable[ParamInfo], opt: OptimizerConfig) -> list[Group]:
    """The groups `opt` makes of `infos`, in order of first appearance; each info's name is listed
    in its group. Decay is only "on" when weight decay is non-zero, so a run without decay has no
    empty split."""
    groups: dict[tuple, Group] = {}
    for info in infos:
        algorithm = ("muon" if takes_muon(info) else "adamw") if opt.kind == "muon" else opt.kind
        decay_rate = opt.weight_decay
        if algorithm == "muon" and opt.muon_weight_decay is not None:
            decay_rate = opt.muon_weight_decay
        decay = decay_rate != 0.0 and not any(matches(p, info) for p in opt.no_decay)
        group = Group(algorithm, decay, lr_factor(info, opt.lr_multipliers))
        group = groups.setdefault(group.key, group)
        group.names.append(info.name)
        group.numel += info.numel
    return list(groups.values())


def unmatched_patterns(infos: Iterable[ParamInfo], opt: OptimizerConfig) -> list[str]:
    """A warning for each regular expression in `no_decay` / `lr_multipliers` that matches no trainable
    parameter: a typo ("nrom") would otherwise decay the norms silently. A role word with no tensor
    of its role (Llama has no biases) is no mistake and is left out."""
    infos = list(infos)
    warnings = []
    for key, patterns in (("optimizer.no_decay", opt.no_decay), ("optimizer.lr_multipliers", opt.lr_multipliers)):
        for pattern in patterns:
            if pattern in ROLE_WORDS or any(matches(pattern, info) for info in infos):
                continue
            names = ", ".join(info.name for info in infos[:2]) + (", ..." if len(infos) > 2 else "")
            warnings.append(
                f"{key} pattern {pattern!r} matches no trainable parameter, so it has no effect; a pattern is a "
                f"role ({', '.join(ROLE_WORDS)}) or a regular expression searched in names such as {names}"
            )
    return warnings


def check_patterns(opt: OptimizerConfig) -> list[Problem]:
    """Invalid regular expressions and factors in `no_decay` / `lr_multipliers` (compile time)."""
    problems = []
    for key, patterns in (("optimizer.no_decay", opt.no_decay), ("optimizer.lr_multipliers", opt.lr_multipliers)):
        for pattern in patterns:
            if pattern in ROLE_WORDS:
                continue
            try:
                re.compile(pattern)
            except re.error as error:
                problems.append(
                    Problem(
                        key,
                        f"{pattern!r} is not a regular expression ({error})",
                        f"use a role ({', '.join(ROLE_WORDS)}) or a valid regular expression, e.g. 'lora_B'",
                    )
                )
    for pattern, factor in opt.lr_multipliers.items():
        if not factor > 0:
            problems.append(Problem("optimizer.lr_multipliers", f"the factor of {pattern!r} must be > 0, got {factor}"))
    return problems


# --- a real module ----------------------------------------------------------------------------------


def module_parameters(model: "torch.nn.Module") -> list[tuple[ParamInfo, "torch.nn.Parameter"]]:
    """The trainable parameters of `model` (DDP-wrapped, FSDP2-sharded or peft-wrapped alike) with
    their roles; the shapes are the full tensors' (a DTensor's global shape)."""
    from torch import nn

    root = getattr(model, "module", model)  # DDP
    head = None
    if hasattr(root, "get_output_embeddings"):
        try:
            head = root.get_output_embeddings()
        except (AttributeError, NotImplementedError):  # some models declare it and do not implement it
            head = None
    modules = dict(model.named_modules())
    # The head's own name, so that a wrapper's inner copy (peft's modules_to_save) is the head too.
    head_names = [name for name, module in modules.items() if head is not None and module is head]
    out = []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        module_name, _, leaf = name.rpartition(".")
        module = modules.get(module_name)
        if isinstance(module, nn.Embedding):
            role = "embedding"
        elif any(module_name == h or module_name.startswith(h + ".") for h in head_names):
            role = "head"
        elif leaf == "bias":
            role = "bias"
        elif parameter.dim() == 1:
            role = "norm"
        elif isinstance(module, nn.Linear):
            role = "linear"
        else:
            role = "other"
        out.append((ParamInfo(name, tuple(parameter.shape), role), parameter))
    return out


def torch_param_groups(model: "torch.nn.Module", opt: OptimizerConfig) -> list[dict[str, Any]]:
    """`group_parameters` over `model` as torch param groups: params, lr (x factor; muon_lr for Muon),
    weight_decay, and "algorithm" (which part of a Muon optimizer updates the group)."""
    from ditty.config.errors import RecipeError

    pairs = module_parameters(model)
    if not pairs:
        raise RecipeError.single(
            "the model has no trainable parameters: every parameter has requires_grad = False",
            fix="check that peft.target_modules names modules the model has, or that a custom model leaves "
            "some parameters trainable",
        )
    by_name = {info.name: parameter for info, parameter in pairs}
    for warning in unmatched_patterns([info for info, _ in pairs], opt):
        log.warning(warning)
    groups = []
    for group in group_parameters([info for info, _ in pairs], opt):
        muon = group.algorithm == "muon"
        rate = opt.muon_weight_decay if muon and opt.muon_weight_decay is not None else opt.weight_decay
        groups.append(
            {
                "params": [by_name[name] for name in group.names],
                "lr": (opt.muon_lr if muon else opt.lr) * group.lr_factor,
                "weight_decay": rate if group.decay else 0.0,
                "algorithm": group.algorithm,
            }
        )
    return groups
