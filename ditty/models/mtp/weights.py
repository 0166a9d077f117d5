"""The MTP heads in a saved model directory (final/, final/merged/, `ditty export`), and back.

Two layouts, chosen by the architecture:

- an architecture that ships MTP layers (DeepSeek-V3, GLM-4.5: ditty.models.mtp.support) keeps them
  where its checkpoints do: depth k as layer `model.layers.{L + k - 1}.*` of the model's own weights
  (L trunk layers; `enorm`, `hnorm`, `eh_proj`, `shared_head.norm` and the block's tensors in the
  checkpoint format, converted back by transformers' own weight conversions), with
  `num_nextn_predict_layers` in config.json. transformers' model classes list those keys as expected
  extras, and its MtpModel loads them for `generate(use_mtp=True)`. The weights become a sharded
  checkpoint (`model-0000i-of-0000n.safetensors` and the index) with the heads in the last file, so no
  weight file is rewritten;
- every other causal LM, and every adapter directory (which holds no trunk weights), gets a separate
  `mtp.safetensors` with the heads under `mtp.layers.{k - 1}.*` (transformers' MtpLayer names, which its
  MtpModel's weight mapping reads after removing the `mtp.` prefix). A separate file because
  transformers reads only the files config.json and the index name: `AutoModelForCausalLM.from_pretrained`
  loads the directory exactly as without heads (extra keys in model.safetensors would be reported as
  unexpected on every load, and dropped by the next `save_pretrained`), and ditty reads the file back.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

from ditty._utils.modules import is_peft_model, unwrap
from ditty.models.mtp.heads import MTP_MODULE, MTPHeads

MTP_FILE = "mtp.safetensors"
PREFIX = f"{MTP_MODULE}."
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def depth_saved(directory: str) -> int:
    """How many MTP depths a saved model directory holds (0: none)."""
    path = os.path.join(directory, MTP_FILE)
    if os.path.isfile(path):
        return len(_depths(_file_keys(path), r"^mtp\.layers\.(\d+)\."))
    config = _read_json(os.path.join(directory, "config.json"))
    if config.get("model_type") not in _native_types():
        return 0
    first = int(config.get("num_hidden_layers", 0))
    return len([d for d in _depths(_checkpoint_keys(directory), r"^model\.layers\.(\d+)\.eh_proj\.") if d >= first])


@contextmanager
def saving_heads(model: Any, directory: str, state_dict: Optional[dict] = None, *, full: bool = False) -> Iterator:
    """Around a `save_pretrained` of `model` into `directory`: yields the state dict to save (the given
    one without the heads' tensors), with the heads detached from the model so the save (and a merge)
    sees the trunk alone; then writes the heads into the directory. `full`: the directory holds a full
    model even though `model` carries an adapter (final/merged/)."""
    base = unwrap(model, peft=True)
    heads = getattr(base, MTP_MODULE, None)
    if heads is None:
        yield state_dict
        return
    if state_dict is not None:
        tensors = {k.split(PREFIX, 1)[1]: v for k, v in state_dict.items() if PREFIX in k}
        state_dict = {k: v for k, v in state_dict.items() if PREFIX not in k}
    else:
        tensors = {k: v.detach() for k, v in heads.state_dict().items()}
    delattr(base, MTP_MODULE)
    try:
        yield state_dict
    finally:
        base.add_module(MTP_MODULE, heads)
    adapter = is_peft_model(unwrap(model)) and not full
    write_heads(directory, base, tensors, native=heads.native and not adapter)


def write_heads(directory: str, base: Any, tensors: dict[str, torch.Tensor], *, native: bool) -> None:
    """The heads' tensors (names `layers.{k}.*` of MTPHeads) into a saved model directory (module doc)."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()}
    depth = len(_depths(tensors, r"^layers\.(\d+)\."))
    if not native:
        metadata = {"format": "pt", "mtp_depth": str(depth), "layout": "transformers MtpLayer"}
        heads = {f"mtp.{name}": t.clone() for name, t in tensors.items()}  # clone: no storage shared between names
        save_file(heads, os.path.join(directory, MTP_FILE), metadata)
        return
    checkpoint = native_names(base, tensors)
    _add_shard(directory, checkpoint)
    config_path = os.path.join(directory, "config.json")
    config = _read_json(config_path)
    config["num_nextn_predict_layers"] = depth
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def native_names(base: Any, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MTPHeads' tensors under the checkpoint names of a model type that ships MTP layers: the block's
    own as those of trunk layer L + k, converted back to the checkpoint format as transformers saves the
    trunk's (its MoE experts, say, one tensor per expert)."""
    from transformers.core_model_loading import revert_weight_conversion

    first = base.config.get_text_config(decoder=True).num_hidden_layers
    renamed = {}
    for name, tensor in tensors.items():
        k, rest = re.match(r"^layers\.(\d+)\.(.*)$", name).groups()
        rest = rest.removeprefix("mtp_block.")
        rest = "shared_head.norm." + rest.removeprefix("post_norm.") if rest.startswith("post_norm.") else rest
        renamed[f"model.layers.{first + int(k)}.{rest}"] = tensor
    return {k: v.contiguous() for k, v in revert_weight_conversion(base, renamed).items()}


def load_heads(heads: MTPHeads, model: Any, directory: str) -> int:
    """Fill the first depths of `heads` from a saved model directory; returns how many it held (0: none,
    the heads stay as built)."""
    if not directory or not os.path.isdir(directory):
        return 0
    path = os.path.join(directory, MTP_FILE)
    if os.path.isfile(path):
        from safetensors.torch import load_file

        saved = {k.removeprefix("mtp."): v for k, v in load_file(path).items()}
        return _load_layers(heads, saved)
    if heads.native and depth_saved(directory):
        return _load_native(heads, unwrap(model, peft=True), directory)
    return 0


def _load_layers(heads: MTPHeads, saved: dict[str, torch.Tensor]) -> int:
    depths = min(len(_depths(saved, r"^layers\.(\d+)\.")), heads.depth)
    for k in range(depths):
        prefix = f"layers.{k}."
        layer = heads.layers[k]
        own = {n[len(prefix) :]: t for n, t in saved.items() if n.startswith(prefix)}
        missing, unexpected = layer.load_state_dict(own, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"the saved MTP depth {k + 1} does not fit this model's heads (missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}): it was trained on another architecture"
            )
    return depths


def _load_native(heads: MTPHeads, base: Any, directory: str) -> int:
    """A checkpoint's own MTP layers, through transformers' MtpModel weight mapping (the mapping its
    `generate(use_mtp=True)` loads them with), into these heads' layers."""
    from safetensors import safe_open
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_layers import MtpModel
    from transformers.modeling_utils import LoadStateDictConfig

    first = base.config.get_text_config(decoder=True).num_hidden_layers
    depths = min(depth_saved(directory), heads.depth)
    wanted = re.compile(rf"^model\.layers\.({'|'.join(str(first + k) for k in range(depths))})\.")
    state = {}
    for file, keys in _checkpoint_files(directory).items():
        with safe_open(file, framework="pt") as f:
            state.update({key: f.get_tensor(key) for key in keys if wanted.match(key)})
    with torch.device("meta"):  # a shell for the mapping: its layers are replaced by the heads' own
        shell = MtpModel(base, depths)
    shell.layers = torch.nn.ModuleList(list(heads.layers)[:depths])
    reference = base.get_input_embeddings().weight
    info, _ = convert_and_load_state_dict_in_model(
        shell,
        state,
        LoadStateDictConfig(weight_mapping=shell.get_weight_conversions(base), dtype=reference.dtype),
    )
    missing = sorted(k for k in info.missing_keys if k.startswith("layers."))
    if missing:
        raise ValueError(f"{directory}: the checkpoint's MTP layers lack {missing[:5]}")
    return depths


# ------------------------------------------------------------------------------------- files


def _native_types() -> frozenset:
    from ditty.models.mtp.support import NATIVE_MTP_TYPES

    return NATIVE_MTP_TYPES


def _depths(names: Any, pattern: str) -> list[int]:
    found = {int(m.group(1)) for name in names if (m := re.match(pattern, name))}
    return sorted(found)


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _file_keys(path: str) -> list[str]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return list(f.keys())


def _tensor_bytes(path: str) -> dict[str, int]:
    from safetensors import safe_open

    sizes = {}
    with safe_open(path, framework="pt") as f:
        for key in f.keys():
            piece = f.get_slice(key)
            count = 1
            for size in piece.get_shape():
                count *= size
            sizes[key] = count * _DTYPE_BYTES.get(piece.get_dtype(), 4)
    return sizes


_DTYPE_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "U8": 1, "I8": 1, "BOOL": 1}


def _checkpoint_files(directory: str) -> dict[str, list[str]]:
    """{weight file: its keys} of a saved model (its index, or its single file)."""
    index = _read_json(os.path.join(directory, INDEX))
    if index:
        files: dict[str, list[str]] = {}
        for key, name in index["weight_map"].items():
            files.setdefault(os.path.join(directory, name), []).append(key)
        return files
    single = os.path.join(directory, SINGLE)
    return {single: _file_keys(single)} if os.path.isfile(single) else {}


def _checkpoint_keys(directory: str) -> list[str]:
    return [key for keys in _checkpoint_files(directory).values() for key in keys]


def _add_shard(directory: str, tensors: dict[str, torch.Tensor]) -> None:
    """Add `tensors` to a saved model as one more weight file of a sharded checkpoint (a single
    model.safetensors becomes the first of two, renamed, not rewritten)."""
    from safetensors.torch import save_file

    index_path = os.path.join(directory, INDEX)
    index = _read_json(index_path)
    if not index:
        sizes = _tensor_bytes(os.path.join(directory, SINGLE))
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": dict.fromkeys(sizes, SINGLE)}
    names = sorted(set(index["weight_map"].values()))
    count = len(names) + 1
    renames = {name: f"model-{i:05d}-of-{count:05d}.safetensors" for i, name in enumerate(names, start=1)}
    for old, new in renames.items():
        os.replace(os.path.join(directory, old), os.path.join(directory, new))
    extra = f"model-{count:05d}-of-{count:05d}.safetensors"
    save_file(tensors, os.path.join(directory, extra), {"format": "pt"})
    weight_map = {key: renames[name] for key, name in index["weight_map"].items()}
    weight_map.update(dict.fromkeys(tensors, extra))
    metadata = dict(index.get("metadata") or {})
    added = sum(t.numel() * t.element_size() for t in tensors.values())
    metadata["total_size"] = int(metadata.get("total_size", 0)) + added
    index = {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}
    with open(index_path, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
