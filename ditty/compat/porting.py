"""The rest of the original Ditty's public names: `TrainerState`, `CheckpointManager`/`Checkpoint`
(reading ditty's checkpoints), and `print_pipeline`.

ditty's trainer saves and resumes checkpoints itself (`Pipeline(checkpoint_every=N)`, resume with
`load_checkpoint=True`), so the original's manager is kept for what scripts do with it outside
the loop: find the newest checkpoint and read what it holds. Its numbers are ditty's step numbers
(`checkpoints/step-N`). Reading never unpickles: DCP tensors through ditty's safe reader, the rest
JSON. Writing or restoring by hand is refused with what to use instead.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ditty.config.errors import RecipeError


@dataclass(kw_only=True)
class TrainerState:
    """Where a run is: the original's counters (`steps` counts ditty's optimizer steps)."""

    epoch: int = 0
    steps: int = 0
    total_steps: int = 0
    global_loss: float = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "steps": self.steps,
            "total_steps": self.total_steps,
            "global_loss": self.global_loss,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict.get("epoch", 0)
        self.steps = state_dict.get("steps", 0)
        self.total_steps = state_dict.get("total_steps", 0)
        self.global_loss = state_dict.get("global_loss", 0.0)


@dataclass
class Checkpoint:
    """What one checkpoint holds, as plain values: full (unsharded) CPU tensors and JSON state."""

    model_state: Optional[dict[str, Any]] = None
    """The model's saved weights by name (only the adapter's for LoRA/DoRA runs)."""
    optimizer_state: Optional[dict[str, Any]] = None
    """The optimizer's tensors by flat name ("state.fc1.weight.exp_avg")."""
    scheduler_state: Optional[dict[str, Any]] = None
    training_state: dict[str, Any] = field(default_factory=dict)
    """TrainerState fields (load with TrainerState().load_state_dict(...)) and ditty's own counters."""
    scaler_state: Optional[dict[str, Any]] = None
    rng_states: dict[str, Any] = field(default_factory=dict)
    loss_state: Optional[dict[str, Any]] = None
    """A loss's parameters (saved with the model as ditty_loss.*)."""
    loss_optimizer_state: Optional[dict[str, Any]] = None
    path: Optional[str] = None
    checkpoint_num: Optional[int] = None


class CheckpointManager:
    """Finds and reads the checkpoints of a run directory (`output_dir/checkpoints/step-N`)."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.checkpoints_dir = os.path.join(output_dir, "checkpoints")

    def get_latest_checkpoint_num(self) -> Optional[int]:
        """The step of the newest complete checkpoint, or None."""
        from ditty.checkpoint import latest_complete
        from ditty.checkpoint.layout import step_of

        root = Path(self.checkpoints_dir)
        found = latest_complete(root) if root.is_dir() else None
        return step_of(found) if found is not None else None

    def load(self, checkpoint_num: Optional[int] = None) -> Optional[Checkpoint]:
        """The checkpoint of step `checkpoint_num` (default: the newest complete one), or None."""
        from ditty.checkpoint import read_sidecar

        step = self.get_latest_checkpoint_num() if checkpoint_num is None else checkpoint_num
        if step is None:
            return None
        path = Path(self.checkpoints_dir) / f"step-{step}"
        if not path.is_dir():
            return None
        doc = read_sidecar(path)
        tensors = _read_tensors(path)
        model = {k.removeprefix("train.model."): v for k, v in tensors.items() if k.startswith("train.model.")}
        optim = {k.removeprefix("train.optim."): v for k, v in tensors.items() if k.startswith("train.optim.")}
        loss = {k.removeprefix("ditty_loss."): v for k, v in model.items() if k.startswith("ditty_loss.")}
        train = dict(doc.get("train_state") or {})
        steps = int(doc["step"])
        return Checkpoint(
            model_state={k: v for k, v in model.items() if not k.startswith("ditty_loss.")} or None,
            optimizer_state=optim or None,
            scheduler_state=doc.get("scheduler"),
            training_state={"epoch": _epoch(doc), "steps": steps, "total_steps": steps, "global_loss": 0.0, **train},
            scaler_state=doc.get("precision"),
            rng_states=dict(doc.get("rng") or {}),
            loss_state=loss or None,
            path=str(path),
            checkpoint_num=steps,
        )

    def apply_to_model(self, checkpoint: Checkpoint, model: Any) -> bool:
        """Load the checkpoint's weights into `model` (strictly, unless it is an adapter's)."""
        if checkpoint.model_state is None:
            return False
        model.load_state_dict(checkpoint.model_state)
        return True

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise RecipeError.single(
            "ditty's trainer writes checkpoints itself",
            key="CheckpointManager.save",
            fix="Pipeline(checkpoint_every=N) saves every N steps and at the end",
        )

    def _resume_only(self, *args: Any, **kwargs: Any) -> None:
        raise RecipeError.single(
            "ditty restores a checkpoint as a whole when a run resumes (model, optimizer, scheduler, RNG, data "
            "position)",
            key="CheckpointManager",
            fix="run the same Pipeline again (load_checkpoint=True, the default): it resumes from the newest "
            "checkpoint",
        )

    apply_to_optimizer = load_rng_state = apply_to_loss_calculator = apply_to_preprocessors = _resume_only


def _read_tensors(path: Path) -> dict[str, Any]:
    """Every tensor of a DCP checkpoint as a full CPU tensor, by flat key, through ditty's safe reader."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from ditty.checkpoint.layout import METADATA
    from ditty.checkpoint.safe_reader import SafeFileSystemReader, read_tensor_metadata

    metadata = read_tensor_metadata(path / METADATA)
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    dcp.load(state, storage_reader=SafeFileSystemReader(path), no_dist=True)
    return state


def _epoch(doc: dict[str, Any]) -> int:
    data = doc.get("data") or {}
    return int(data.get("epoch", 0)) if isinstance(data, dict) else 0


def print_pipeline(
    pipeline_or_model: Any,
    preprocessors: Optional[list] = None,
    postprocessors: Optional[list] = None,
    loss_calculator: Any = None,
    model_contract: str = "",
) -> None:
    """Print a pipeline's stages, their contracts and the chain check: `print_pipeline(pipeline)`,
    or the original's `print_pipeline(model, preprocessors, postprocessors, loss, model_contract)`."""
    if hasattr(pipeline_or_model, "describe") and preprocessors is None and loss_calculator is None:
        print(pipeline_or_model.describe())
        return
    from ditty.recipe.chain_report import describe_chain

    model = pipeline_or_model
    total = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if total else 0
    title = f"model {type(model).__name__}: {total:,} parameters, {trainable:,} trainable; pipeline"
    stand_in = types.SimpleNamespace(contract=model_contract or getattr(model, "contract", None))
    print(
        describe_chain(
            list(preprocessors or []),
            stand_in,
            list(postprocessors or []),
            loss_calculator,
            model_name=f"model ({type(model).__name__})",
            title=title,
        )
    )
