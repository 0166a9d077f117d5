"""The one reference model of every objective that compares the policy with one (DPO, IPO, KTO, the KL
term of GRPO and RLOO), and what it holds, which the memory planner asks before anything is built.

A setting names it: "auto", "precompute" or a model path/hub id (`preference.reference`; RL's KL
reference is always "auto").
- "auto" with an adapter ("adapter"): the policy itself with its adapter disabled (peft's
  `disable_adapter()`), under no_grad: no second copy of the weights;
- "auto" on a full finetune ("copy"): a frozen copy of the weights the run starts from, taken before
  the first step (so a resumed run copies the same starting weights again, not the trained ones);
  under fsdp/hsdp it is sharded like the policy, on the same mesh; under DeepSpeed ZeRO-2 (which
  shards no parameters) it is whole, like the policy;
- a path ("path"): that model, loaded once, frozen, sharded like the policy under fsdp/hsdp;
- "precompute": the starting model's log-probabilities of every training and held-out sample, computed
  once before training into `run_dir/reference_logps.pt` (keyed by the sample's tokens, so mixtures,
  repeats and any order find them). The file also holds the starting model's fingerprint (a hash of
  the weights the reference scores with): a rerun reads it back only when the model it starts from
  is the same, and scores then the samples the file lacks (data changed under force_resume); a
  file from another model is computed again. Sequence sums only: sampled completions (RL) are new at
  every step and cannot be looked up.

A reference given by path must share the policy's tokenizer: it scores the policy's token ids, so
another vocabulary (or a table too short for the ids, which loading would grow with random rows) is
refused before anything is loaded.

Every reference answers `sequence_logps(batch)` (per-row sums over the scored tokens, the DPO family's
input) and, but "precompute", `token_logps(batch, temperature)` (per token, aligned with the labels:
GRPO's KL). Scores come from the output head in chunks (ditty.objectives.logprobs): no full logits.
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
from ditty.objectives.footprint import SHARDED_KINDS, loaded_as_is, reference_kind
from ditty.objectives.logprobs import model_token_logps, sequence_logps

log = logging.getLogger("ditty.train")

REFERENCE_FILE = "reference_logps.pt"


def build_reference(run: Any, setting: str, *, chunks: int, key: str) -> Optional["Reference"]:
    """The reference `setting` names (see the module doc), built for the run's policy `run.model`.
    `key`: the recipe key that chose it, for messages."""
    kind = reference_kind(run.config, setting)
    if not kind:
        return None
    policy = unwrap(run.model)
    sharded = run.config.parallel.kind in SHARDED_KINDS
    if kind == "adapter":
        if not is_peft_model(policy):
            raise RuntimeError("an adapter reference needs the policy to carry its adapter (peft.kind)")
        return AdapterDisabled(policy, chunks)
    if kind == "copy":
        # The policy has not stepped yet: a copy of it is the starting weights (deep-copied: FSDP2 modules cannot be).
        return FrozenModel(sharded_copy(run, policy, key) if sharded else frozen(copy.deepcopy(policy)), chunks)
    if kind == "precompute":
        return Precomputed.for_run(run, policy, chunks)
    config = run.config
    from ditty.objectives.frozen_models import refuse_damaged, refuse_new_head

    refuse_damaged(setting, key)
    refuse_another_tokenizer(run.tokenizer, setting, key, trust_remote_code=config.model.trust_remote_code)
    other = replace(config, model=loaded_as_is(config.model, setting))
    with errors_named(key):  # it loads as a model.path would: the user wrote `key`
        if sharded:
            separate = sharded_like_policy(run, other)
        else:
            from ditty.models.recipe_model import base_model_for

            separate, _ = base_model_for(other, run.tokenizer, run.runtime.device, low_memory=False)
    refuse_new_head(separate, setting, key)
    return FrozenModel(separate if sharded else frozen(separate), chunks)


@contextlib.contextmanager
def errors_named(key: str):
    """A RecipeError about `model.path` raised inside is about `key` (the reference's or teacher's path)."""
    from ditty.config.errors import RecipeError

    try:
        yield
    except RecipeError as failed:
        problems = [_renamed(p, key) if p.key == "model.path" else p for p in failed.problems]
        raise RecipeError(problems, source=failed.source) from failed


def _renamed(problem: Any, key: str) -> Any:
    """`problem` about model.path, about `key` instead, in its fix as well ("set model.path to ...")."""
    fix = problem.fix.replace("model.path", key) if problem.fix else problem.fix
    return replace(problem, key=key, message=problem.message.replace("model.path", key), fix=fix)


def refuse_another_tokenizer(tokenizer: Any, path: str, key: str, *, trust_remote_code: bool = False) -> None:
    """A RecipeError when the model at `path` was trained with another tokenizer than the policy's
    `tokenizer` (the student's, for a teacher: `key` distill.*): it would score the policy's ids as its
    own, other, tokens. A directory without tokenizer files is held to its embedding table, which must
    have a row for every id (loading grows a shorter one with random rows), and is taken to share the
    tokenizer (a warning says so); a hub id that cannot be read offline is not checked."""
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return
    from ditty.config.errors import RecipeError
    from ditty.data.tokenizer import holds_no_tokenizer

    local = os.path.expanduser(path)
    owner = "student" if key.startswith("distill.") else "policy"
    fix = f"use a model trained with the {owner}'s tokenizer (such as the checkpoint the {owner} starts from)"
    if os.path.isdir(local) and holds_no_tokenizer(local):
        from transformers import AutoConfig

        try:
            rows = AutoConfig.from_pretrained(local, trust_remote_code=trust_remote_code).get_text_config().vocab_size
        except (OSError, ValueError, AttributeError):
            return  # not a model directory: loading it says why
        if rows is not None and rows < len(tokenizer):
            raise RecipeError.single(
                f"{path!r} has {rows} token embeddings and the {owner}'s tokenizer {len(tokenizer)} ids: "
                f"the ids beyond its table would get random rows, and it holds no tokenizer to show it is the "
                f"{owner}'s",
                key=key,
                fix=fix,
            )
        log.warning(
            "%s = %r holds no tokenizer files, so its vocabulary cannot be compared with the %s's: it is taken "
            "to be the same",
            key,
            path,
            owner,
        )
        return
    from transformers import AutoTokenizer

    from ditty.models.build import hub_out_of_reach

    if hub_out_of_reach(path):
        return  # not here and the Hub out of reach: loading the model says so, at once
    try:
        source = local if os.path.isdir(local) else path
        theirs = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return  # a hub id offline, or no tokenizer: loading the model says what is wrong
    ours_vocab, their_vocab = tokenizer.get_vocab(), theirs.get_vocab()
    if ours_vocab == their_vocab:
        return
    if len(their_vocab) != len(ours_vocab):
        what = f"{len(their_vocab)} ids against the {owner}'s {len(ours_vocab)}"
    else:
        token = next(t for t in sorted(ours_vocab, key=ours_vocab.get) if their_vocab.get(t) != ours_vocab[t])
        what = f"the same {len(ours_vocab)} ids for other tokens: {token!r} is {ours_vocab[token]} to the {owner}, "
        what += f"{their_vocab.get(token)} to it"
    raise RecipeError.single(
        f"{path!r} has another tokenizer than the {owner}'s ({what}): it would score the {owner}'s "
        "token ids as its own tokens",
        key=key,
        fix=fix,
    )


class Reference:
    """A frozen model to score batches with (no gradients); see the module doc."""

    kind = ""
    chunks = 8

    @contextlib.contextmanager
    def scoring(self):
        """The model to run, for the duration of one scoring forward."""
        raise NotImplementedError
        yield

    def token_logps(self, batch: Mapping[str, Tensor], temperature: float = 1.0) -> Tensor:
        """log p(label t | tokens before t) [B, T] of the scored labels (0 elsewhere), the logits
        divided by `temperature` (the rollouts' sampling distribution)."""
        with torch.no_grad(), self.scoring() as model:
            return model_token_logps(model, batch, chunks=self.chunks, temperature=temperature)[0]

    def sequence_logps(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Per-row sums of the completion log-probabilities [B] (a context-parallel rank's pieces summed
        over its group: every rank gets the whole rows')."""
        from ditty.objectives.context_rows import whole_row_sums

        with torch.no_grad(), self.scoring() as model:
            logps, scored = model_token_logps(model, batch, chunks=self.chunks)
        return whole_row_sums(sequence_logps(logps, scored)[0])

    def __call__(self, batch: Mapping[str, Tensor]) -> Tensor:  # PreferenceLoss's ReferenceFn
        return self.sequence_logps(batch)


class FrozenModel(Reference):
    """A separate frozen model (a copy of the starting weights, or another checkpoint)."""

    def __init__(self, model: torch.nn.Module, chunks: int) -> None:
        self.model, self.chunks = model, chunks
        self.kind = "model"

    @contextlib.contextmanager
    def scoring(self):
        yield self.model


class AdapterDisabled(Reference):
    """The policy with its adapter switched off for one forward: the base model, no second copy. The
    policy is put in eval mode meanwhile (no dropout in a reference), as a frozen model is."""

    kind = "adapter"

    def __init__(self, peft_model: torch.nn.Module, chunks: int) -> None:
        self.model, self.chunks = peft_model, chunks

    @contextlib.contextmanager
    def scoring(self):
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                yield self.model
        finally:
            self.model.train(was_training)


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def sharded_like_policy(run: Any, config: Any) -> torch.nn.Module:
    """The model `config` names, frozen and sharded by the run's engine on the run's mesh (fsdp/hsdp):
    each rank holds its shard, and every rank takes part in each of its forwards, as for the policy.
    A local safetensors checkpoint is built on the meta device and each rank loads its own slice."""
    from ditty.models.recipe_model import base_model_for

    model, pending = base_model_for(config, run.tokenizer, run.runtime.device, low_memory=True)
    frozen(model)
    return frozen(run.engine.wrap(model, pending))


def sharded_copy(run: Any, policy: torch.nn.Module, key: str) -> torch.nn.Module:
    """A full finetune's frozen starting weights under fsdp/hsdp: the `[model]` structure sharded like
    the policy, then each rank copies its own shards of the policy's (not yet trained) parameters, so a
    randomly initialised model gets the same weights. FSDP2 modules cannot be deep-copied."""
    from ditty.config.errors import RecipeError

    if run.components.model is not None:
        raise RecipeError.single(
            f'a reference copy of the starting weights under parallel.kind = "{run.config.parallel.kind}" '
            "rebuilds the model from [model] (sharded modules cannot be copied), and this run was given a model "
            "instance",
            key=key,
            fix='use an adapter (peft.kind = "lora"), parallel.kind = "ddp", or give the model as a [model] path'
            + (', or preference.reference = "precompute"' if key.startswith("preference") else ""),
        )
    reference = sharded_like_policy(run, run.config)
    ours, theirs = list(reference.parameters()), list(policy.parameters())
    if [tuple(p.shape) for p in ours] != [tuple(p.shape) for p in theirs]:
        raise RuntimeError("the sharded reference does not have the policy's parameters; cannot copy them")
    with torch.no_grad():
        for mine, source in zip(ours, theirs):
            mine.copy_(source)
    return reference


# ---------------------------------------------------------------------------- precomputed


def sample_key(input_ids: Iterable[int], labels: Iterable[int]) -> str:
    """A stable key of one scored sequence (its tokens and which of them are scored)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(torch.as_tensor(list(input_ids), dtype=torch.int64).numpy().tobytes())
    digest.update(torch.as_tensor(list(labels), dtype=torch.int64).numpy().tobytes())
    return digest.hexdigest()


class Precomputed(Reference):
    """Reference log-probabilities looked up by each row's tokens (see the module doc)."""

    kind = "precompute"

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table

    @classmethod
    def for_run(cls, run: Any, model: torch.nn.Module, chunks: int) -> "Precomputed":
        from ditty._utils.dist import is_main_process, on_every_rank

        path = os.path.join(run.config.run.output_dir, REFERENCE_FILE)
        fingerprint = model_fingerprint(model)  # the policy has not stepped yet: the starting model
        table: dict[str, float] = {}
        # Every rank decides alike: under fsdp the scoring forwards are collectives, and a node-local
        # output_dir may lack the file.
        if on_every_rank(os.path.exists(path)):
            saved = torch.load(path, weights_only=True)
            if on_every_rank(isinstance(saved, dict) and saved.get("fingerprint") == fingerprint):
                table = dict(saved["table"])
            else:
                log.warning(
                    "%s was computed from another starting model than this run's (model.path or its weights "
                    "changed): computing it again",
                    path,
                )
        known = len(table)
        bundle = run.data.bundle
        table = compute_table(model, reference_datasets(bundle), bundle.collator, chunks, known=table)
        if known and len(table) > known:
            log.warning(
                "%d sequences of the data were not in %s (the data changed): scored now by the starting model",
                len(table) - known,
                path,
            )
        if len(table) > known and is_main_process():  # written whole, then renamed: a killed run leaves no half file
            torch.save({"fingerprint": fingerprint, "table": table}, path + ".partial")
            os.replace(path + ".partial", path)
            log.info("reference log-probabilities of %d sequences precomputed into %s", len(table), path)
        return cls(table)

    def token_logps(self, batch: Mapping[str, Tensor], temperature: float = 1.0) -> Tensor:
        raise TypeError('a "precompute" reference holds sequence sums only, not per-token log-probabilities')

    def sequence_logps(self, batch: Mapping[str, Tensor]) -> Tensor:
        keys = row_keys(batch)
        missing = [k for k in keys if k is not None and k not in self.table]
        if missing:  # for_run scores every sample of the run's data: a row from elsewhere
            raise RuntimeError(f"{len(missing)} sequences have no precomputed reference log-probability")
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


def compute_table(
    model: torch.nn.Module,
    datasets: list,
    collator: Any,
    chunks: int,
    batch_size: int = 16,
    known: Optional[dict] = None,
) -> dict:
    """{row key: reference log-probability sum} of every sample of `datasets` (the adapter off): the
    entries of `known`, and the rest computed (a batch whose every row is known is not run)."""
    from ditty._utils.dist import on_every_rank
    from ditty.data.collate import fetch_rows

    device = next(model.parameters()).device
    scorer: Reference = AdapterDisabled(model, chunks) if is_peft_model(model) else FrozenModel(model, chunks)
    table: dict[str, float] = dict(known or {})
    was_training = model.training
    model.eval()
    for dataset in datasets:
        for start in range(0, len(dataset), batch_size):
            batch = collator(fetch_rows(dataset, list(range(start, min(start + batch_size, len(dataset))))))
            keys = row_keys(batch)
            if on_every_rank(all(key is None or key in table for key in keys)):
                continue
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            values = scorer.sequence_logps(batch).double().cpu().tolist()
            for key, value in zip(keys, values):
                if key is not None:
                    table[key] = value
    model.train(was_training)
    return table


def model_fingerprint(model: torch.nn.Module) -> str:
    """A hash of the weights a reference scores with: every parameter's name, shape, dtype and values
    (an adapter's own, trainable, parameters left out: the reference runs with it off). Under a
    sharded engine each rank hashes its shards and the ranks' hashes are joined."""
    import torch.distributed as dist
    import xxhash

    digest = xxhash.xxh3_64()
    adapter = is_peft_model(model)
    for name, parameter in model.named_parameters():
        if adapter and parameter.requires_grad:
            continue
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        tensor = local.detach()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        if tensor.numel() and not tensor.is_meta:
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    mine = digest.hexdigest()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        return xxhash.xxh3_64_hexdigest(",".join(every).encode())
    return mine
