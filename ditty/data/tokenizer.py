"""Tokenizers: the model's own (through AutoTokenizer) or a built-in byte-level one needing no files.

The byte tokenizer exists so that from-scratch recipes, tests and the default recipe run offline:
every byte is one token, so any text round-trips exactly and nothing has to be trained or fetched.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ditty._utils.errors import condensed
from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    from ditty.config.sections import ModelConfig, TokenizerConfig

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"

# One line per turn, "role: content". The assistant's content and its end-of-sequence token sit
# inside {% generation %} markers, so `apply_chat_template(..., return_assistant_tokens_mask=True)`
# marks exactly the tokens the model must learn to produce (its answer and when to stop).
BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: "
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}"
    "{% else %}"
    "{{ message['content'] }}"
    "{% endif %}"
    "{{ '\\n' }}"  # a literal newline after a block tag would be eaten by jinja's trim_blocks
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def byte_tokenizer() -> "PreTrainedTokenizerFast":
    """A byte-level tokenizer: ids 0-2 are `<pad>`, `<s>`, `</s>`, ids 3-258 one per byte.

    Built from the `tokenizers` library's byte-level pieces (a BPE model with the 256-symbol
    byte alphabet and no merges), so it saves as a plain `tokenizer.json` that
    `AutoTokenizer.from_pretrained` reloads with identical ids. Like Llama's tokenizer it prepends
    `<s>` when `add_special_tokens` is on (the default); `decode(..., skip_special_tokens=True)`
    gives back the text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]
    # alphabet() comes in set order; sorting makes the ids the same in every process.
    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate(specials + byte_symbols)}

    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # use_regex=False: no word splitting is needed when every byte is its own token.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    backend.add_special_tokens(specials)

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        chat_template=BYTE_CHAT_TEMPLATE,
        model_max_length=1_000_000,  # no intrinsic limit; ditty truncates to data.max_seq_len itself
        padding_side="right",
    )


def build_tokenizer(tok: "TokenizerConfig", model: "ModelConfig") -> "PreTrainedTokenizerBase":
    """The tokenizer a recipe asks for, with a pad token guaranteed (eos when the model has none).

    A path that is neither a local directory nor a reachable hub id is a user error (RecipeError
    naming `tokenizer.path`, or `model.path` when the tokenizer defaults to the model's).
    """
    tokenizer = _tokenizer_of(tok, model)
    if tok.chat_template:
        from ditty.data.chat_templates import chat_template_text

        tokenizer.chat_template = chat_template_text(tok.chat_template)
    return tokenizer


def _tokenizer_of(tok: "TokenizerConfig", model: "ModelConfig") -> "PreTrainedTokenizerBase":
    path = tok.source(model)
    if path is None:  # kind "byte", or "auto" with neither path: a random-init model's byte tokenizer
        return byte_tokenizer()
    key = "tokenizer.path" if tok.path else "model.path"
    tokenizer = _load_auto_tokenizer(path, key, trust_remote_code=model.trust_remote_code)
    if tokenizer.pad_token is None:
        # Padding positions are masked out of attention and loss, so any existing token will do;
        # eos avoids growing the vocabulary (which would resize the embedding).
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_auto_tokenizer(path: str, key: str, *, trust_remote_code: bool) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    local_path = os.path.expanduser(path)
    if not os.path.isdir(local_path) and not _looks_like_hub_id(path):
        raise RecipeError.single(
            f"tokenizer directory {path!r} does not exist",
            key=key,
            fix="point it at a directory holding tokenizer files, or at a hub id such as org/name",
        )
    is_local = os.path.isdir(local_path)
    try:
        return AutoTokenizer.from_pretrained(local_path if is_local else path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        # transformers raises OSError for a missing repo, a missing file and an offline cache miss
        # alike; its message says which, so it is passed on.
        if is_local:
            fix = "the directory must hold the tokenizer's files (tokenizer.json, tokenizer_config.json, ...)"
        elif os.environ.get("HF_HUB_OFFLINE") == "1":
            fix = "offline mode is on (HF_HUB_OFFLINE=1): download the tokenizer first or use a local directory"
        else:
            fix = "check the hub id and the network"
        message = f"cannot load a tokenizer from {path!r}: {condensed(error)}"
        raise RecipeError.single(message, key=key, fix=fix) from error


def _looks_like_hub_id(path: str) -> bool:
    """Hub ids are "name" or "org/name"; anything with more slashes or a leading ./~ is a path."""
    return path.count("/") <= 1 and not path.startswith((".", "/", "~"))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model")


def holds_no_tokenizer(path: str | None) -> bool:
    """A local model directory without tokenizer files (a hub id cannot be known offline: False)."""
    if not path or not os.path.isdir(os.path.expanduser(path)):
        return False
    directory = os.path.expanduser(path)
    return not any(os.path.isfile(os.path.join(directory, name)) for name in TOKENIZER_FILES)


def tokenizer_beside(model) -> "PreTrainedTokenizerBase | None":
    """The tokenizer saved with a transformers model's checkpoint (`model.name_or_path`, a local
    directory holding tokenizer files), with a pad token as `build_tokenizer` guarantees; None for
    other models, or when there is none to be found offline."""
    path = getattr(getattr(model, "config", None), "name_or_path", None) or getattr(model, "name_or_path", None)
    if not path or not os.path.isdir(os.path.expanduser(str(path))):
        return None
    directory = os.path.expanduser(str(path))
    if holds_no_tokenizer(directory):
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError):
        return None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
