"""The reference model of preference optimisation (`preference.reference`) and the loss the trainer
builds for preference data.

- "auto" with an adapter: the policy itself with its adapter disabled (peft's `disable_adapter()`),
  under no_grad: no second copy of the weights;
- "auto" for a full finetune: a frozen copy of the weights the run starts from (taken before the
  first step, so a resumed run copies the same starting weights again, not the trained ones);
  under fsdp/hsdp it is sharded like the policy, on the same mesh;
- a model path or hub id: that model, loaded once, frozen (sharded like the policy under fsdp/hsdp);
- "precompute": the log-probabilities of the starting model for every training and held-out sample,
  computed once before training and kept in `run_dir/reference_logps.pt` (keyed by the sample's
  tokens, so mixtures, repeats and any order find them); a resumed run reads the file back.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Iterable, Optional

import torch
from torch import Tensor

from ditty._utils.modules import is_peft_model, unwrap
from ditty.config.preference import REFERENCE_FREE
from ditty.config.sections import SHARDED_KINDS
from ditty.objectives.logprobs import model_token_logps, sequence_logps

log = logging.getLogger("ditty.train")

REFERENCE_FILE = "reference_logps.pt"


def preference_loss(trainer: Any, model: torch.nn.Module) -> Any:
    """The trainer's loss for preference data (ditty.recipe.preference_rules.preference_training)."""
    from ditty.train.preference_loss import PreferenceLoss

    cfg = trainer.config.preference
    return PreferenceLoss(cfg, None if cfg.kind in REFERENCE_FREE else build_reference(trainer, model))


def preference_method(config: Any) -> str:
    """What the model card's "method" adds for preference training ("" otherwise)."""
    from ditty.recipe.preference_rules import preference_training

    if not preference_training(config):
        return ""
    pref = config.preference
    reference = "" if pref.kind in REFERENCE_FREE else f", reference {pref.reference}"
    extra = f", sft_weight {pref.sft_weight:g}" if pref.sft_weight and pref.kind in ("dpo", "ipo") else ""
    return f"; preference optimisation: {pref.kind.upper()} (beta {pref.beta:g}{reference}{extra})"


def build_reference(trainer: Any, model: torch.nn.Module) -> Any:
    cfg, chunks = trainer.config.preference, trainer.config.preference.chunks
    inner = unwrap(model)
    sharded = trainer.config.parallel.kind in SHARDED_KINDS
    if cfg.reference == "auto" and is_peft_model(inner):
        return AdapterDisabled(inner, chunks)
    if cfg.reference == "auto" and sharded:
        return FrozenModel(sharded_copy(trainer, inner), chunks)
    if cfg.reference == "auto":
        return FrozenModel(frozen(copy.deepcopy(inner)), chunks)
    if cfg.reference == "precompute":
        return Precomputed.for_run(trainer, inner, chunks)
    config = trainer.config
    reference_config = replace(config, model=replace(config.model, path=cfg.reference, init="pretrained"))
    if sharded:
        return FrozenModel(sharded_like_policy(trainer, reference_config), chunks)
    from ditty.models.recipe_model import base_model_for

    separate, _ = base_model_for(reference_config, trainer.tokenizer, trainer.runtime.device, low_memory=False)
    return FrozenModel(frozen(separate), chunks)


def sharded_like_policy(trainer: Any, config: Any) -> torch.nn.Module:
    """The model `config` names, frozen and sharded by the run's engine on the run's mesh (fsdp/hsdp):
    each rank holds its shard, and every rank takes part in each of its forwards, as for the policy.
    A local safetensors checkpoint is built on the meta device and each rank loads its own slice."""
    from ditty.models.recipe_model import base_model_for

    model, pending = base_model_for(config, trainer.tokenizer, trainer.runtime.device, low_memory=True)
    frozen(model)
    return frozen(trainer.engine.wrap(model, pending))


def sharded_copy(trainer: Any, policy: torch.nn.Module) -> torch.nn.Module:
    """A full finetune's frozen starting weights under fsdp/hsdp: the `[model]` structure sharded like
    the policy, then each rank copies its own shards of the policy's (not yet trained) parameters, so a
    randomly initialised model gets the same weights. FSDP2 modules cannot be deep-copied."""
    from ditty.config.errors import RecipeError

    if trainer.components.model is not None:
        raise RecipeError.single(
            f'preference.reference = "auto" on a full finetune under parallel.kind = "{trainer.config.parallel.kind}" '
            "rebuilds the model from [model], and this run was given a model instance",
            key="preference.reference",
            fix='use an adapter (peft.kind = "lora"), reference = "precompute", or parallel.kind = "ddp"',
        )
    reference = sharded_like_policy(trainer, trainer.config)
    ours, theirs = list(reference.parameters()), list(policy.parameters())
    if [tuple(p.shape) for p in ours] != [tuple(p.shape) for p in theirs]:
        raise RuntimeError("the sharded reference does not have the policy's parameters; cannot copy them")
    with torch.no_grad():
        for mine, source in zip(ours, theirs):
            mine.copy_(source)
    return reference


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def sequence_logps_of(model: torch.nn.Module, batch: Mapping[str, Tensor], chunks: int) -> Tensor:
    """Per-row sums of the completion log-probabilities of `model` on `batch` (no gradients)."""
    with torch.no_grad():
        logps, scored = model_token_logps(model, batch, chunks=chunks)
    return sequence_logps(logps, scored)[0]


class FrozenModel:
    """A separate frozen model (a copy of the starting weights, or another checkpoint)."""

    def __init__(self, model: torch.nn.Module, chunks: int) -> None:
        self.model, self.chunks = model, chunks

    def __call__(self, batch: Mapping[str, Tensor]) -> Tensor:
        return sequence_logps_of(self.model, batch, self.chunks)


class AdapterDisabled:
    """The policy with its adapter switched off for one forward: the base model, no second copy."""

    def __init__(self, peft_model: torch.nn.Module, chunks: int) -> None:
        self.model, self.chunks = peft_model, chunks

    def __call__(self, batch: Mapping[str, Tensor]) -> Tensor:
        with self.model.disable_adapter():
            return sequence_logps_of(self.model, batch, self.chunks)


def sample_key(input_ids: Iterable[int], labels: Iterable[int]) -> str:
    """A stable key of one scored sequence (its tokens and which of them are scored)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(torch.as_tensor(list(input_ids), dtype=torch.int64).numpy().tobytes())
    digest.update(torch.as_tensor(list(labels), dtype=torch.int64).numpy().tobytes())
    return digest.hexdigest()


class Precomputed:
    """Reference log-probabilities looked up by each row's tokens (see the module doc)."""

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table

    @classmethod
    def for_run(cls, trainer: Any, model: torch.nn.Module, chunks: int) -> "Precomputed":
        from ditty._utils.dist import is_main_process, on_every_rank

        path = os.path.join(trainer.config.run.output_dir, REFERENCE_FILE)
        # A resumed run reads the same starting model's figures back. Every rank decides alike: under
        # fsdp the scoring forwards are collectives, and a node-local output_dir may lack the file.
        if on_every_rank(os.path.exists(path)):
            return cls(torch.load(path, weights_only=True))
        table = compute_table(model, reference_datasets(trainer.data.bundle), trainer.data.bundle.collator, chunks)

        if is_main_process():  # written whole, then renamed: a killed run leaves no half file
            torch.save(table, path + ".partial")
            os.replace(path + ".partial", path)
        log.info("reference log-probabilities of %d sequences precomputed into %s", len(table), path)
        return cls(table)

    def __call__(self, batch: Mapping[str, Tensor]) -> Tensor:
        keys = row_keys(batch)
        missing = [k for k in keys if k is not None and k not in self.table]
        if missing:
            raise KeyError(f"{len(missing)} sequences have no precomputed reference log-probability")
        return torch.tensor([self.table.get(k, 0.0) if k else 0.0 for k in keys], dtype=torch.float64)


def row_keys(batch: Mapping[str, Tensor]) -> list[Optional[str]]:
    """The key of every row of a collated batch (None for a row with nothing scored)."""
    keys: list[Optional[str]] = []
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        length = int(mask.sum())
        scored = bool((labels[1:length] != -100).any())
        keys.append(sample_key(ids[:length].tolist(), labels[:length].tolist()) if scored else None)
    return keys


def reference_datasets(bundle: Any) -> list:
    """Every set whose samples the reference scores: training (each source of a mixture) and held out."""
    from ditty.data.mixture import MixtureData

    train = bundle.train
    sets = list(train.datasets) if isinstance(train, MixtureData) else [train]
    sets += [bundle.val] if bundle.val is not None else []
    sets += [dataset for _, dataset in bundle.val_sets]
    return sets


def compute_table(model: torch.nn.Module, datasets: list, collator: Any, chunks: int, batch_size: int = 16) -> dict:
    """{row key: reference log-probability sum} of every sample of `datasets` (the adapter off)."""
    device = next(model.parameters()).device
    table: dict[str, float] = {}
    was_training = model.training
    model.eval()
    scoring = model.disable_adapter() if is_peft_model(model) else contextlib.nullcontext()
    with scoring:
        _score_all(model, datasets, collator, chunks, batch_size, device, table)
    model.train(was_training)
    return table


def _score_all(model, datasets, collator, chunks, batch_size, device, table) -> None:
    from ditty.data.collate import fetch_rows

    for dataset in datasets:
        for start in range(0, len(dataset), batch_size):
            batch = collator(fetch_rows(dataset, list(range(start, min(start + batch_size, len(dataset))))))
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            values = sequence_logps_of(model, batch, chunks).double().cpu().tolist()
            for key, value in zip(row_keys(batch), values):
                if key is not None:
                    table[key] = value
