"""Model files follow the umask like every other file ditty writes: another user of a shared
directory can read final/ and an export (safetensors 0.8 alone would leave the weights 0600)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from ditty._utils.atomic import atomic_directory
from ditty.train.final import save_model_files


@pytest.fixture
def umask():
    before = os.umask(0o022)
    os.umask(before)

    def set_umask(mask: int) -> None:
        os.umask(mask)

    yield set_umask
    os.umask(before)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_a_saved_model_directory_gives_its_weights_the_umask_mode(tmp_path, umask, mask, expected):
    from transformers import AutoModelForCausalLM

    umask(mask)
    hugging_face = AutoModelForCausalLM.from_config(_tiny_config())
    custom = torch.nn.Linear(3, 2)
    for name, model in (("hf", hugging_face), ("custom", custom)):
        target = tmp_path / name / "final"
        with atomic_directory(target, replace=False) as partial:
            save_model_files(model, None, str(partial))
        weights = sorted(target.rglob("*.safetensors"))
        assert weights, name
        for path in weights:
            assert mode(path) == expected, (name, path.name, oct(mode(path)))
        assert not list(target.glob(".mode-probe-*"))
        if name == "hf":
            assert mode(target / "config.json") == expected  # the same mode as the files open() writes


def _tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=40,
    )
