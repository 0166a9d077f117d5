"""A DCP reader that never runs code from the checkpoint.

DCP's `FileSystemReader` reads `.metadata` with a bare `pickle.load` and reads non-tensor entries
with `torch.load(weights_only=False)`; a checkpoint downloaded from elsewhere could run anything.
This reader unpickles `.metadata` through an allow-list of the plain record types DCP writes there
(its metadata dataclasses, torch.Size, dtypes, paths) and refuses a checkpoint that declares any
non-tensor (bytes) entry, since loading one would go through the unsafe `torch.load`. Tensor data
itself DCP already reads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import enum
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

_ALLOWED_MODULES = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"}
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps a layout's name ("torch.strided") to the object
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
    ("pathlib._local", "PosixPath"),
    ("pathlib._local", "WindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _ALLOWED_MODULES:
            obj = super().find_class(module, name)
            # Only the module's own record classes and enums; never one of its functions.
            if isinstance(obj, type) and (obj.__module__ == module or issubclass(obj, enum.Enum)):
                return obj
        raise pickle.UnpicklingError(
            f"checkpoint metadata refers to {module}.{name}, which a DCP checkpoint written by ditty "
            f"never contains; refusing to load it"
        )


def read_metadata_file(path) -> Metadata:
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"{path} does not hold DCP metadata")
    return metadata


def read_tensor_metadata(path) -> Metadata:
    """Metadata of a checkpoint that holds tensors only; raises UnpicklingError otherwise."""
    metadata = read_metadata_file(path)
    byte_entries = [k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    if byte_entries:
        raise pickle.UnpicklingError(
            f"checkpoint {path} stores non-tensor entries inside DCP ({', '.join(byte_entries[:3])}); "
            f"reading them would unpickle arbitrary objects, so ditty refuses"
        )
    return metadata


class SafeFileSystemReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_tensor_metadata(self._get_metadata_path(kwargs.get("rank")))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
