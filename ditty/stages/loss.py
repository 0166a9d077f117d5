"""Loss calculators: the last stage of the pipeline, from the model's output (and the context) to a loss.

Three kinds of result (docs/ARCHITECTURE.md, the flow):
- a token loss returns the SUM over its supervised tokens and their count (`num_tokens`); the trainer
  divides by the count of the whole global batch (all micro-batches, all ranks), so any split of a
  global batch gives the same loss and gradients (CausalLMLoss);
- a loss over global counts (the post-training objectives, ditty.objectives) declares the units it
  is a mean over with `count_units(batch)` (pairs, examples, sequences, tokens: the first is its
  denominator); the trainer sums each over the whole global batch before the first forward and hands
  the totals over as `ctx["global_units"]`, and the loss returns its SHARE of the global-batch value
  (`LossOutput.share`), its metrics too, which the trainer adds up over micro-batches and ranks;
- any other loss returns a MEAN over its micro-batch (num_tokens None); the trainer weights it by
  the micro-batch's share of the samples (MSELoss, L1Loss, CrossEntropyLoss, CompositeLoss).

torch is imported inside functions so the recipe compiler can check user subclasses cheaply.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence, Union

from ditty._utils.labels import IGNORE_INDEX, SHIFTED_LABELS
from ditty._utils.names import snake_case

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class LossOutput:
    loss: "Tensor"
    """A sum over `num_tokens` tokens when `num_tokens` is given, this micro-batch's share of the
    global-batch loss when `share`, else a mean over the micro-batch."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Extra scalars to log (averaged over the micro-batches of a step; added up when `share`)."""
    num_tokens: "Union[Tensor, int, None]" = None
    """Supervised tokens the summed `loss` covers; None when `loss` is already a mean or a share."""
    share: bool = False
    """`loss` and `metrics` are this micro-batch's shares of the global-batch values (sums divided by
    the counts of `ctx["global_units"]`, see the module doc)."""

    def mean_loss(self) -> "Tensor":
        """The loss as a mean over this micro-batch alone (per token for token losses)."""
        if self.num_tokens is None:
            return self.loss
        import torch

        count = torch.as_tensor(self.num_tokens, device=self.loss.device, dtype=self.loss.dtype)
        return self.loss / count.clamp_min(1)  # a micro-batch without supervised tokens has sum 0


class LossCalculator(ABC):
    """Base of every loss: finds the prediction in the model's output and the target in the context.

    `output_index` picks the prediction: an int indexes a tuple/list output (a single-tensor output
    is index 0; a Hugging Face ModelOutput indexes its non-None fields in order); a str names an
    attribute or key ("logits"). `target_key` and `mask_key` name context entries; a key missing
    from the context is looked up in ctx["batch"], then ctx["original_batch"], so batch columns
    such as labels need no postprocessor to reach the loss. `contract` is as for processors.
    """

    def __init__(
        self,
        output_index: Union[int, str] = 0,
        target_key: str = "target",
        mask_key: Optional[str] = "mask",
        *,
        contract: Optional[str] = None,
        name: str = "",
        fsdp: bool = False,
    ) -> None:
        self.output_index = output_index
        self.target_key = target_key
        self.mask_key = mask_key
        self.contract = contract
        self.name = name or snake_case(type(self).__name__)
        """How metrics and `print_pipeline` call this loss (the original Ditty's `name`)."""
        if fsdp:
            raise loss_sharding_refused()

    def __call__(self, model_output: Any, ctx: Mapping) -> LossOutput:
        return self.compute(model_output, ctx)

    @abstractmethod
    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        """The loss of one micro-batch."""

    def get_prediction(self, model_output: Any) -> "Tensor":
        import torch

        index = self.output_index
        if isinstance(index, str):
            if isinstance(model_output, Mapping) and index in model_output:
                return model_output[index]
            if hasattr(model_output, index):
                return getattr(model_output, index)
            raise KeyError(f"{type(self).__name__}: the model output ({type(model_output).__name__}) has no {index!r}")
        if torch.is_tensor(model_output):
            if index == 0:
                return model_output
            raise IndexError(f"{type(self).__name__}: output_index {index}, but the model returned a single tensor")
        # ModelOutput is a Mapping too, but integer indexing is its documented to_tuple() order.
        if isinstance(model_output, (tuple, list)) or hasattr(model_output, "to_tuple"):
            outputs = model_output.to_tuple() if hasattr(model_output, "to_tuple") else model_output
            if not -len(outputs) <= index < len(outputs):
                raise IndexError(
                    f"{type(self).__name__}: output_index {index}, but the model returned {len(outputs)} outputs"
                )
            return outputs[index]
        raise TypeError(
            f"{type(self).__name__}: cannot index a {type(model_output).__name__} output with {index!r}; "
            'name the entry instead (output_index="name")'
        )

    def get_target(self, ctx: Mapping) -> "Tensor":
        target = _lookup(ctx, self.target_key)
        if target is None:
            raise KeyError(
                f"{type(self).__name__}: no {self.target_key!r} in the context or the batch "
                f"(context keys: {sorted(ctx)}); a postprocessor must provide it, or set target_key"
            )
        return target

    def get_mask(self, ctx: Mapping) -> "Optional[Tensor]":
        return _lookup(ctx, self.mask_key) if self.mask_key else None


def shifted_labels(ctx: Mapping) -> "Optional[Tensor]":
    """The batch's SHIFTED_LABELS: present on a context-parallel rank's slice of rows, whose labels were
    shifted over the whole rows before the cut (ditty.data.context_shard)."""
    return _lookup(ctx, SHIFTED_LABELS)


def _lookup(ctx: Mapping, key: str) -> Any:
    if key in ctx:
        return ctx[key]
    for batch_key in ("batch", "original_batch"):
        batch = ctx.get(batch_key)
        if isinstance(batch, Mapping) and key in batch:
            return batch[key]
    return None


class CrossEntropyLoss(LossCalculator):
    """Mean cross-entropy over the targets that count: not `ignore_index`, and inside the mask if any.

    Predictions carry classes in their last dimension ([N, C] against [N], or [B, T, C] against
    [B, T]). Computed in fp32 whatever the model's dtype.
    """

    def __init__(
        self,
        output_index: Union[int, str] = 0,
        target_key: str = "target",
        mask_key: Optional[str] = "mask",
        *,
        ignore_index: int = IGNORE_INDEX,
        contract: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(output_index, target_key, mask_key, contract=contract, **kwargs)
        self.ignore_index = ignore_index

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        target = self.get_target(ctx)
        mask = self.get_mask(ctx)
        if mask is not None:
            target = target.masked_fill(~mask.bool(), self.ignore_index)
        total, count = token_cross_entropy(self.get_prediction(model_output), target, self.ignore_index)
        return LossOutput(loss=total / count.clamp_min(1))


class CausalLMLoss(CrossEntropyLoss):
    """Next-token cross-entropy: logits at position t against labels at t + 1.

    Labels are unshifted (Hugging Face convention: `labels` equals `input_ids` where a loss is
    wanted, IGNORE_INDEX elsewhere). Returns the sum over supervised tokens and their count, so the
    trainer can normalise over the whole global batch.
    """

    def __init__(
        self,
        output_index: Union[int, str] = "logits",
        target_key: str = "labels",
        *,
        ignore_index: int = IGNORE_INDEX,
        contract: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            output_index, target_key, mask_key=None, ignore_index=ignore_index, contract=contract, **kwargs
        )

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        shifted = shifted_labels(ctx)
        if shifted is not None:
            total, count = token_cross_entropy(self.get_prediction(model_output), shifted, self.ignore_index)
            return LossOutput(loss=total, num_tokens=count)
        logits = self.get_prediction(model_output)[..., :-1, :]
        labels = self.get_target(ctx)[..., 1:]
        total, count = token_cross_entropy(logits, labels, self.ignore_index)
        return LossOutput(loss=total, num_tokens=count)

    def count_tokens(self, batch: Mapping) -> "Tensor":
        """Supervised tokens of a batch before its forward (the trainer's global-batch denominator)."""
        if SHIFTED_LABELS in batch:
            return (batch[SHIFTED_LABELS] != self.ignore_index).sum()
        return (batch[self.target_key][..., 1:] != self.ignore_index).sum()


def token_cross_entropy(
    logits: "Tensor", target: "Tensor", ignore_index: int = IGNORE_INDEX
) -> "tuple[Tensor, Tensor]":
    """Sum of fp32 cross-entropy over targets other than `ignore_index`, and how many there are.

    Cost: the fp32 copy of the logits ([tokens, vocab]), as in transformers' own loss; bf16 logits
    would lose about three digits in the log-sum-exp.
    """
    import torch.nn.functional as F

    from ditty.stages.vocab_parallel import is_vocab_sharded, sharded_cross_entropy

    if is_vocab_sharded(logits, -1):  # tensor parallel: each rank holds a share of the vocabulary
        return sharded_cross_entropy(logits, target, ignore_index)
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    flat_target = target.reshape(-1).to(flat_logits.device)
    total = F.cross_entropy(flat_logits, flat_target, ignore_index=ignore_index, reduction="sum")
    return total, (flat_target != ignore_index).sum()


class _ElementwiseLoss(LossCalculator):
    """Mean of an elementwise error over the prediction, or over the masked elements.

    A mask may cover the leading dimensions only ([B] or [B, T] for a [B, T, D] prediction); it is
    broadcast over the rest. Computed in fp32. `reduction = "sum"` sums instead of averaging.
    """

    def __init__(
        self,
        output_index: Union[int, str] = 0,
        target_key: str = "target",
        mask_key: Optional[str] = "mask",
        *,
        reduction: str = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(output_index, target_key, mask_key, **kwargs)
        if reduction not in ("mean", "sum"):
            from ditty.config.errors import RecipeError

            raise RecipeError.single(
                f"{type(self).__name__}(reduction={reduction!r}): use 'mean' or 'sum'", key="loss_calculator"
            )
        self.reduction = reduction

    @abstractmethod
    def elementwise(self, prediction: "Tensor", target: "Tensor") -> "Tensor":
        """Per-element error."""

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        import torch

        prediction = self.get_prediction(model_output).float()
        error = self.elementwise(prediction, self.get_target(ctx).to(prediction.device).float())
        mask = self.get_mask(ctx)
        if mask is None:
            return LossOutput(loss=error.sum() if self.reduction == "sum" else error.mean())
        mask = mask.to(error.device, torch.float32).reshape(mask.shape + (1,) * (error.dim() - mask.dim()))
        weights = mask.expand_as(error)
        total = (error * weights).sum()
        return LossOutput(loss=total if self.reduction == "sum" else total / weights.sum().clamp_min(1))


class MSELoss(_ElementwiseLoss):
    """Mean squared error against `ctx[target_key]` (optionally masked)."""

    def elementwise(self, prediction: "Tensor", target: "Tensor") -> "Tensor":
        return (prediction - target).square()


class L1Loss(_ElementwiseLoss):
    """Mean absolute error against `ctx[target_key]` (optionally masked)."""

    def elementwise(self, prediction: "Tensor", target: "Tensor") -> "Tensor":
        return (prediction - target).abs()


def _part(index: int, entry: Any) -> tuple["LossCalculator", float]:
    """A CompositeLoss part `(loss, weight)`, checked: a ValueError naming the part otherwise."""
    import numbers

    pair = isinstance(entry, (tuple, list)) and len(entry) == 2
    loss, weight = entry if pair else (entry, None)
    if not pair:
        problem = f"is a {type(entry).__name__}, not a (loss, weight) pair"
    elif not isinstance(loss, LossCalculator):
        problem = f"holds a {type(loss).__module__}.{type(loss).__qualname__}, not a ditty LossCalculator"
    elif isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        problem = f"has the weight {weight!r}, not a number"
    else:
        return loss, float(weight)
    raise ValueError(
        f"CompositeLoss part {index} {problem}: e.g. CompositeLoss([(MSELoss(), 1.0), "
        "(CrossEntropyLoss(output_index=1), 0.1)])"
    )


class CompositeLoss(LossCalculator):
    """A weighted sum of losses; the metrics carry each part's (unweighted) value.

    Parts are combined as micro-batch means (a token loss's sum is divided by its own count first),
    because parts with different token counts have no common denominator. The global-batch token
    normalisation of a lone CausalLMLoss therefore does not carry over into a composite.
    Cost: one host sync per part and micro-batch, to read the part's value for the metrics.
    """

    def __init__(
        self, losses: Sequence[tuple[LossCalculator, float]], *, contract: Optional[str] = None, **kwargs: Any
    ) -> None:
        super().__init__(contract=contract, **kwargs)
        if not losses:
            raise ValueError("CompositeLoss needs at least one (loss, weight) part")
        self.parts = [_part(index, entry) for index, entry in enumerate(losses)]
        self.names = _part_names([loss for loss, _ in self.parts])

    @property
    def losses(self) -> list[tuple[LossCalculator, float]]:
        """The (loss, weight) parts, under the original Ditty's name."""
        return self.parts

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        total = None
        metrics: dict[str, float] = {}
        for name, (loss, weight) in zip(self.names, self.parts):
            out = loss.compute(model_output, ctx)
            value = out.mean_loss()
            total = weight * value if total is None else total + weight * value
            metrics[name] = value.detach().item()
            metrics.update({f"{name}/{key}": v for key, v in out.metrics.items()})
        return LossOutput(loss=total, metrics=metrics)


def _part_names(losses: Sequence[LossCalculator]) -> list[str]:
    """Metric names from class names (MSELoss -> "mse", CrossEntropyLoss -> "cross_entropy"),
    numbered when a class appears twice."""
    bases = []
    for loss in losses:
        name = type(loss).__name__.removesuffix("Loss") or type(loss).__name__
        bases.append(snake_case(name))
    return [f"{base}_{index}" if bases.count(base) > 1 else base for index, base in enumerate(bases)]


class UncertaintyWeightedLoss(CompositeLoss):
    """Several losses weighted by learned uncertainties (Kendall, Gal & Cipolla, CVPR 2018).

    One learned log-variance s_i per loss; the total is sum_i 0.5 * exp(-s_i) * L_i + 0.5 * s_i, the
    paper's objective for homoscedastic task uncertainty (s_i = log sigma_i^2). A loss that stays
    large is down-weighted, and the + s_i term keeps every weight from collapsing to zero. The
    s_i start at 0 (every weight 1/2). The metrics carry each part's value, its weight exp(-s_i)
    and s_i. (The original Ditty clamped the regulariser to s_i >= 0; this follows the paper.)

    The log-variances are a trainable `log_vars` parameter (`named_parameters()`): the trainer
    trains them with the model (`ditty.stages.loss_parameters`), so they reach the optimizer, are
    averaged across DDP ranks and are saved in checkpoints.
    Cost: one host sync per part and micro-batch (its value and weight for the metrics).
    """

    def __init__(self, losses: Sequence[LossCalculator], *, contract: Optional[str] = None, **kwargs: Any) -> None:
        import torch

        pairs = [item for item in losses if isinstance(item, tuple)]
        if pairs:
            from ditty.config.errors import RecipeError

            raise RecipeError.single(
                "UncertaintyWeightedLoss learns each loss's weight: pass the losses alone, not (loss, weight) pairs",
                key="loss_calculator",
                fix="UncertaintyWeightedLoss([MSELoss(), CrossEntropyLoss(output_index=1)]), or CompositeLoss for "
                "fixed weights",
            )
        super().__init__([(loss, 1.0) for loss in losses], contract=contract, **kwargs)
        self.log_vars = torch.nn.Parameter(torch.zeros(len(self.parts)))

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        yield "log_vars", self.log_vars

    def parameters(self) -> Iterator[Any]:
        yield self.log_vars

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        total = None
        metrics: dict[str, float] = {}
        for index, (name, (loss, _)) in enumerate(zip(self.names, self.parts)):
            out = loss.compute(model_output, ctx)
            value = out.mean_loss()
            log_var = self.log_vars[index].to(value.device)
            term = 0.5 * (-log_var).exp() * value + 0.5 * log_var
            total = term if total is None else total + term
            metrics[name] = value.detach().item()
            metrics[f"{name}/weight"] = (-log_var).exp().detach().item()
            metrics[f"{name}/log_var"] = log_var.detach().item()
            metrics.update({f"{name}/{key}": v for key, v in out.metrics.items()})
        return LossOutput(loss=total, metrics=metrics)


def loss_sharding_refused(kind: str = "fsdp") -> Exception:
    from ditty.config.errors import RecipeError

    return RecipeError.single(
        f"a loss with trainable parameters (such as UncertaintyWeightedLoss) is not supported with "
        f"parallel.kind = {kind!r}: its parameters would be sharded with the model, outside whose forward the "
        f"loss runs",
        key="loss_calculator",
        fix="train it on one process or with DDP (FSDPConfig(enabled=False)); its parameters then train with the model",
    )
