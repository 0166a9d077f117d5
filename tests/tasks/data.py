"""Small data files of every task format, made from ditty's built-in "topics" and "reverse" problems."""

from __future__ import annotations

import json
from pathlib import Path

from ditty.data import builtin


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def topic_rows(count: int, offset: int = 0) -> list[tuple[str, str]]:
    return builtin.generate_problems("topics", count + offset)[offset:]


def classification_rows(count: int, offset: int = 0) -> list[dict]:
    return [{"text": text, "label": label} for text, label in topic_rows(count, offset)]


def token_rows(count: int, offset: int = 0) -> list[dict]:
    """Each word tagged with its topic ("O" for the filler words)."""
    topic_of = {word: topic for topic, words in builtin.TOPIC_WORDS.items() for word in words}
    rows = []
    for text, _ in topic_rows(count, offset):
        words = text.split()
        rows.append({"tokens": words, "tags": [topic_of.get(word, "O") for word in words]})
    return rows


def seq2seq_rows(count: int, offset: int = 0) -> list[dict]:
    problems = builtin.generate_problems("reverse", count + offset)[offset:]
    return [{"source": prompt, "target": completion} for prompt, completion in problems]


def write_task_files(root: Path) -> dict[str, str]:
    files = {}
    for name, make in (
        ("classification", classification_rows),
        ("token_classification", token_rows),
        ("seq2seq", seq2seq_rows),
        ("masked_lm", lambda n, o=0: [{"text": row["text"]} for row in classification_rows(n, o)]),
    ):
        files[name] = _write(root / f"{name}.jsonl", make(48))
        files[f"{name}_val"] = _write(root / f"{name}_val.jsonl", make(12, 48))
    return files
