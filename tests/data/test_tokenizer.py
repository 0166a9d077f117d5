"""The byte tokenizer round-trips through save/AutoTokenizer; build_tokenizer reports bad paths."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from ditty.config.errors import RecipeError
from ditty.config.sections import ModelConfig, TokenizerConfig
from ditty.data.tokenizer import build_tokenizer, byte_tokenizer

# Like every Hugging Face tokenizer, "<s>" written in the text is read as the special token (the
# chat template relies on it), so texts here avoid the special tokens' spelling.
TEXTS = ["12+47=59", "Hello, wörld ✓\n\ttabs and  spaces", "", "<p> tags & ünïcode </p>"]


def test_byte_tokenizer_round_trips_through_save_and_auto_tokenizer(tmp_path):
    tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)

    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert reloaded(text)["input_ids"] == ids
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id) == (0, 1, 2)
    assert len(reloaded) == len(tokenizer) == 259
    assert reloaded.chat_template == tokenizer.chat_template


def test_byte_tokenizer_is_one_token_per_byte_and_the_same_in_every_build():
    text = "añ✓"
    ids = byte_tokenizer()(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))
    assert byte_tokenizer().get_vocab() == byte_tokenizer().get_vocab()


def test_chat_template_marks_only_assistant_tokens():
    tokenizer = byte_tokenizer()
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    rendered = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    assistant = [i for i, flag in zip(rendered["input_ids"], rendered["assistant_masks"]) if flag]
    assert tokenizer.decode(assistant) == "4</s>6</s>"
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<s>system: be brief\nuser: 2+2?\nassistant: "


def test_build_tokenizer_byte_and_auto(tiny_llama_dir):
    assert build_tokenizer(TokenizerConfig(kind="byte"), ModelConfig()).pad_token == "<pad>"
    loaded = build_tokenizer(TokenizerConfig(), ModelConfig(path=tiny_llama_dir))
    assert loaded("12+47=")["input_ids"] == byte_tokenizer()("12+47=")["input_ids"]


def test_build_tokenizer_sets_a_missing_pad_token_to_eos(tmp_path):
    tokenizer = byte_tokenizer()
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    loaded = build_tokenizer(TokenizerConfig(path=str(tmp_path)), ModelConfig())
    assert loaded.pad_token == loaded.eos_token == "</s>"


@pytest.mark.parametrize(
    ("tok", "model", "key"),
    [
        (TokenizerConfig(path="/no/such/tokenizer/dir"), ModelConfig(), "tokenizer.path"),
        (TokenizerConfig(), ModelConfig(path="./missing-model-dir"), "model.path"),
        (TokenizerConfig(), ModelConfig(path="ditty-test/no-such-model"), "model.path"),  # hub id, offline
    ],
)
def test_build_tokenizer_bad_paths_are_recipe_errors(tok, model, key):
    with pytest.raises(RecipeError) as caught:
        build_tokenizer(tok, model)
    assert f"`{key}`" in str(caught.value)


def test_auto_with_no_path_is_the_byte_tokenizer_as_the_compiler_and_planner_take_it():
    """`ditty init`'s starter recipe: a random init, tokenizer.kind "auto" and no path anywhere."""
    from ditty.plan.source import BYTE_TOKENIZER_SIZE

    tok, model = TokenizerConfig(), ModelConfig()
    assert tok.source(model) is None
    assert len(build_tokenizer(tok, model)) == BYTE_TOKENIZER_SIZE
