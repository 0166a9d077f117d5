"""Preference files of the built-in addition task whose rejected answers are a model's own mistakes.

    python tools/own_mistake_pairs.py MODEL_DIR OUT_DIR [--rejected own|synthetic]

writes OUT_DIR/train.jsonl (prompt, chosen, rejected: the built-in training draws in their order,
chosen the correct sum) and OUT_DIR/val.jsonl (the built-in held-out problems with their built-in
rejected answers); files already there are refused, not replaced. With `--rejected own` a training
pair's rejected answer is MODEL_DIR's greedy answer to its prompt where that answer is wrong (and
not empty), else the built-in synthetic one; with `synthetic` it is always the built-in one, so that
`ditty run tiny_dpo --data.source file --data.path OUT_DIR/train.jsonl --data.val_path
OUT_DIR/val.jsonl` trains on exactly what `tiny_dpo` reads (the same held-out figures, measured). It
measures the fixed, offline form of online pairs: the start policy's mistakes, made once, against
the data's pairs, with nothing else changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ditty.data.builtin import generate_problems, split_problems, wrong_answer

NUM_SAMPLES, VAL_FRACTION = 20000, 0.05  # tiny_dpo's [data]
MAX_NEW_TOKENS = 5  # the longest sum (198) and its end of sequence, and one more: a longer answer is wrong anyway


def greedy_answers(model_dir: str, prompts: list[str], batch_size: int = 512) -> dict[str, str]:
    """Each prompt's greedy completion, tokenized as ditty tokenizes a prompt (with its BOS)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    answers = {}
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        encoded = tokenizer(chunk, return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(**encoded, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=pad)
        for prompt, row in zip(chunk, generated[:, encoded.input_ids.shape[1] :].tolist()):
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            answers[prompt] = tokenizer.decode(row, skip_special_tokens=True).strip()
    return answers


def rejected_for(prompt: str, answer: str, mistake: Optional[str]) -> str:
    """The model's greedy answer where it is a wrong, non-empty one (an empty completion is a bad
    preference row), else the built-in synthetic wrong answer."""
    return mistake if mistake and mistake != answer else wrong_answer(prompt, answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--rejected", choices=("own", "synthetic"), default="own")
    args = parser.parse_args()
    out = Path(args.out_dir)
    if args.rejected == "own" and not (Path(args.model_dir) / "config.json").is_file():
        parser.error(f"{args.model_dir} is not a saved model (no config.json): pass a run's final/ directory")
    existing = [str(out / name) for name in ("train.jsonl", "val.jsonl") if (out / name).exists()]
    if existing:
        parser.error(f"{', '.join(existing)} already exist: choose a new OUT_DIR, or remove them")
    train, held_out = split_problems(generate_problems("addition", NUM_SAMPLES), VAL_FRACTION)
    greedy = greedy_answers(args.model_dir, sorted({p for p, _ in train})) if args.rejected == "own" else {}
    out.mkdir(parents=True, exist_ok=True)
    own = 0
    with open(out / "train.jsonl", "w") as f:
        for prompt, answer in train:
            rejected = rejected_for(prompt, answer, greedy.get(prompt))
            own += rejected == greedy.get(prompt)
            f.write(json.dumps({"prompt": prompt, "chosen": answer, "rejected": rejected}) + "\n")
    with open(out / "val.jsonl", "w") as f:
        for prompt, answer in held_out:
            f.write(json.dumps({"prompt": prompt, "chosen": answer, "rejected": wrong_answer(prompt, answer)}) + "\n")
    print(f"{len(train)} training pairs ({own} with the model's own mistake), {len(held_out)} held-out pairs")


if __name__ == "__main__":
    main()
