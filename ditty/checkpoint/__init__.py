"""Checkpoints: sharded tensors through torch.distributed.checkpoint, everything else as JSON.

`CheckpointManager` saves, finds, loads and prunes `RUN_DIR/checkpoints/step-N`;
`ModelOptimizerState` wraps a model and its optimizer for it; `rng` captures and restores random
generators; `ditty.checkpoint.hub` (imported on its own, it pulls in huggingface_hub) pushes a
finished model and writes its card.
"""

from .integrity import find_intact
from .load import find_checkpoint, latest_complete, load_checkpoint
from .manager import CheckpointManager
from .sidecar import read as read_sidecar
from .stateful import ModelOptimizerState

__all__ = [
    "CheckpointManager",
    "ModelOptimizerState",
    "find_checkpoint",
    "find_intact",
    "latest_complete",
    "load_checkpoint",
    "read_sidecar",
]
