"""Shared fixtures: tiny Hugging Face models saved to temporary directories stand in for hub ids."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _save_tiny(path, model_type: str, **overrides):
    """A random tiny causal LM of `model_type` (seed 0) and ditty's byte tokenizer, saved in Hugging Face
    format to `path`; `overrides` replace or add config fields."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ditty.data.tokenizer import byte_tokenizer  # built-in tokenizer: no files to download

    tokenizer = byte_tokenizer()
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    config = AutoConfig.for_model(model_type, **{**settings, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A 2-layer, 64-wide Llama with the byte tokenizer, saved in Hugging Face format."""
    return _save_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory):
    return _save_tiny(tmp_path_factory.mktemp("tiny-mistral"), "mistral", sliding_window=None)


@pytest.fixture
def no_allocator_settings(monkeypatch):
    """The test, and the processes it starts, run without the caller's host allocator settings:
    ditty's DITTY_CPU_ALLOCATOR, torch's THP_MEM_ALLOC_ENABLE and glibc's MALLOC_* and GLIBC_TUNABLES
    (ditty.parallel.allocator reads them all)."""
    ours = ("DITTY_CPU_ALLOCATOR", "THP_MEM_ALLOC_ENABLE", "GLIBC_TUNABLES")
    for name in [n for n in os.environ if n in ours or n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def forbid_unpickling(monkeypatch):
    """A function that, once called, fails the test if anything unpickles: pickle.load(s), or
    torch.load without weights_only=True (call it after writing the checkpoint, before reading it)."""
    import pickle

    import torch

    def no_pickle(*args, **kwargs):
        raise AssertionError("pickle.load called while reading a checkpoint")

    real_torch_load = torch.load

    def weights_only_load(*args, **kwargs):
        assert kwargs.get("weights_only") is True, "torch.load without weights_only=True"
        return real_torch_load(*args, **kwargs)

    def install() -> None:
        monkeypatch.setattr(pickle, "load", no_pickle)
        monkeypatch.setattr(pickle, "loads", no_pickle)
        monkeypatch.setattr(torch, "load", weights_only_load)

    return install


def pytest_collection_modifyitems(config, items):
    """Files holding a test marked `slow` run first, each file's tests still together and in order:
    `pytest -n 2 --dist loadgroup` hands tests out in this order, so the long ones start early and
    the run ends on short tests instead of one worker finishing a long test while the other idles
    (the `xdist_group("parallel")` unit is handed out first by xdist itself). Tests marked `gpu`
    are skipped (and so counted in the summary) where CUDA is absent."""
    files_with_slow_tests = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in files_with_slow_tests)  # stable: order kept within each part
    gpu_tests = [item for item in items if "gpu" in item.keywords]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu)")
    for item in gpu_tests:
        item.add_marker(skip)
