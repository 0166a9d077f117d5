"""Other names of ditty's keys: keys users bring from other tools, and ditty's own keys that moved.

`FOREIGN_KEYS`: the Hugging Face Trainer's, TRL's, peft's and axolotl's names for ditty's keys, so an
unknown `learning_rate` says "did you mean `lr`?" instead of listing every key. A difflib match cannot
find these: `learning_rate` is not spelled like `lr`, nor `per_device_train_batch_size` like
`micro_batch_size`. Where the meaning differs (a ratio where ditty counts steps, an accumulation count
where ditty keeps the global batch), the note says how.

`MOVED_KEYS`: ditty's keys that moved to another section. A recipe, a flag or a saved checkpoint's
recipe that writes the old key still works: the loader moves it (`move_keys`) and the compiler warns,
naming the new key.
"""

from __future__ import annotations

from typing import Any, Optional

FOREIGN_KEYS: dict[str, tuple[str, str]] = {
    # name elsewhere: (ditty's dotted key, how the meaning differs; "" when it does not)
    "learning_rate": ("optimizer.lr", ""),
    "num_train_epochs": ("train.epochs", ""),
    "num_epochs": ("train.epochs", ""),
    "max_steps": ("train.steps", ""),
    "per_device_train_batch_size": ("train.micro_batch_size", ""),
    "train_batch_size": ("train.micro_batch_size", ""),
    "batch_size": ("train.global_batch_size", "samples per optimizer step, over all processes"),
    "gradient_accumulation_steps": (
        "train.global_batch_size",
        "ditty derives accumulation: global_batch_size = micro_batch_size x accumulation x processes",
    ),
    "warmup_ratio": ("scheduler.warmup_steps", "ditty counts warmup in steps: the ratio x train.steps"),
    "lr_scheduler_type": ("scheduler.kind", ""),
    "lr_scheduler": ("scheduler.kind", ""),
    "optim": ("optimizer.kind", ""),
    "adam_beta1": ("optimizer.betas", "both betas as one list, e.g. [0.9, 0.999]"),
    "adam_beta2": ("optimizer.betas", "both betas as one list, e.g. [0.9, 0.999]"),
    "adam_epsilon": ("optimizer.eps", ""),
    "lora_r": ("peft.r", ""),
    "lora_rank": ("peft.r", ""),
    "lora_alpha": ("peft.alpha", ""),
    "lora_dropout": ("peft.dropout", ""),
    "lora_target_modules": ("peft.target_modules", ""),
    "max_seq_length": ("data.max_seq_len", ""),
    "max_length": ("data.max_seq_len", ""),
    "sequence_len": ("data.max_seq_len", ""),
    "model_name_or_path": ("model.path", ""),
    "base_model": ("model.path", ""),
    "torch_dtype": ("model.dtype", ""),
    "logging_steps": ("train.log_every", ""),
    "eval_steps": ("train.eval_every", ""),
    "save_steps": ("checkpoint.every", ""),
    "save_total_limit": ("checkpoint.keep_last", ""),
    "resume_from_checkpoint": ("checkpoint.resume", ""),
    "gradient_checkpointing": ("train.activation_checkpointing", 'a choice: "none", "full" or "selective"'),
    "bf16": ("train.precision", 'a choice: precision = "bf16"'),
    "fp16": ("train.precision", 'a choice: precision = "fp16"'),
    "torch_compile": ("train.compile", ""),
    "load_in_4bit": ("quant.kind", 'a choice: kind = "bnb-4bit"'),
    "load_in_8bit": ("quant.kind", 'a choice: kind = "bnb-8bit"'),
    "hub_model_id": ("hub.repo_id", ""),
    "push_to_hub": ("hub.push", 'a choice: push = "end"'),
    "dataloader_num_workers": ("data.num_workers", ""),
}


def foreign_key_fix(key: str, section: str = "", *, flag: bool = False) -> Optional[str]:
    """'did you mean ...?' for a key another tool uses, or None. `section` is where it was written:
    in a recipe the fix names the bare key when ditty's key is in that section, else the dotted one;
    for a flag (`flag=True`) it names the whole flag."""
    found = FOREIGN_KEYS.get(key.lower())
    if found is None:
        return None
    target, note = found
    target_section, name = target.split(".", 1)
    shown = f"--{target}" if flag else (name if section == target_section else target)
    return f"did you mean `{shown}`? (`{key}` is another tool's name)" + (f"; {note}" if note else "")


MOVED_KEYS: dict[str, str] = {
    **{
        f"rl.{name}": f"rollout.{name}"
        for name in (
            "backend",
            "temperature",
            "top_p",
            "max_new_tokens",
            "generation_batch_size",
            "vllm_memory",
            "vllm_server",
            "vllm_timeout_s",
            "vllm_retries",
            "max_staleness",
            "sampler_correction",
            "correction_cap",
        )
    },
    "distill.max_new_tokens": "rollout.max_new_tokens",
}
"""old dotted key -> where it lives now: [rollout] holds how every on-policy row samples."""


def moved_key(path: str) -> Optional[str]:
    """The current key of an old dotted key, or None."""
    return MOVED_KEYS.get(path)


def move_keys(data: dict[str, Any]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Move the old keys of a parsed recipe (TOML tables as dicts) to their new places, in place.

    Returns ({new key: old key} for every key moved, [(old, new) set both ways]): a key written both
    ways is the caller's error to report (which one was meant is not for the loader to guess)."""
    moved: dict[str, str] = {}
    clashes: list[tuple[str, str]] = []
    for old, new in MOVED_KEYS.items():
        old_section, old_name = old.split(".", 1)
        table = data.get(old_section)
        if not isinstance(table, dict) or old_name not in table:
            continue
        new_section, new_name = new.split(".", 1)
        target = data.setdefault(new_section, {})
        if not isinstance(target, dict):
            continue  # a [rollout] that is not a table: the schema reports it
        if new_name in target:
            table.pop(old_name)  # reported once, as the clash, not again as an unknown key
            clashes.append((old, new))
            continue
        target[new_name] = table.pop(old_name)
        moved[new] = old
    return moved, clashes


def moved_key_message(old: str, new: str) -> tuple[str, str]:
    """(message, fix) of the warning for an old key written where its new one belongs."""
    section = new.split(".", 1)[0]
    why = " (how every on-policy row samples)" if section == "rollout" else ""
    return f"is now {new}: [{section}] holds it{why}; the old key still works", f"write it as {new}"
