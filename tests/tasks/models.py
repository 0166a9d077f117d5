"""Tiny random models of the encoder and encoder-decoder families, saved in Hugging Face format with
a tokenizer, as a user's local pretrained directory would be (nothing is downloaded).

Dropout is off, so one process and two FSDP ranks compute the same losses (dropout draws per rank).
BERT-style models get a real WordPiece tokenizer (`wordpiece_tokenizer`: [CLS]/[SEP]/[MASK], whole
words for the test data's vocabulary, single characters and ## pieces for everything else); T5 and
BART get ditty's byte tokenizer. Encoders are saved as their masked-LM class, as pretrained encoders
are published, so a classifier built on one gets a new head (and BERT a new pooler).
"""

from __future__ import annotations

import string
from pathlib import Path

WORDS = (
    "the a this that old new big small early late we they you will may can after before near with today "
    "tomorrow again still very quite really some every other team goal score match coach league ball race "
    "player stadium bread soup cheese recipe kitchen apple dinner salad spice oven rain cloud storm sunny wind "
    "snow forecast thunder fog humid song guitar piano melody band concert drum chorus violin album"
).split()


def wordpiece_tokenizer(cls_name: str = "BertTokenizerFast"):
    """A lower-casing WordPiece tokenizer over WORDS plus every letter and digit (also as ## pieces)."""
    import transformers

    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), *WORDS]
    vocab = {token: index for index, token in enumerate(dict.fromkeys(tokens))}
    return getattr(transformers, cls_name)(vocab=vocab, do_lower_case=True)


ENCODER_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def save_encoder(path: Path, model_type: str) -> str:
    """bert, distilbert, roberta or deberta-v2, 2 layers, 32 wide, as its masked-LM class."""
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM

    tokenizer = wordpiece_tokenizer("DistilBertTokenizerFast" if model_type == "distilbert" else "BertTokenizerFast")
    sizes = dict(ENCODER_SIZES, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if model_type == "distilbert":
        sizes = dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, dropout=0.0, attention_dropout=0.0)
    extra = {"type_vocab_size": 2} if model_type == "roberta" else {}
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
        **extra,
    )
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def save_seq2seq(path: Path, model_type: str) -> str:
    """t5 or bart, 2 + 2 layers, 32 wide, with the byte tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    if model_type == "t5":
        config = AutoConfig.for_model(
            "t5",
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            **common,
        )
    else:
        config = AutoConfig.for_model(
            "bart",
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=128,
            dropout=0.0,
            attention_dropout=0.0,
            decoder_start_token_id=tokenizer.eos_token_id,
            forced_eos_token_id=tokenizer.eos_token_id,
            **common,
        )
    torch.manual_seed(0)
    AutoModelForSeq2SeqLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
