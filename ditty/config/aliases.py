"""Keys users bring from other tools (the Hugging Face Trainer, TRL, peft, axolotl) and ditty's key
for each, so an unknown `learning_rate` says "did you mean `lr`?" instead of listing every key.

A difflib match cannot find these: `learning_rate` is not spelled like `lr`, nor
`per_device_train_batch_size` like `micro_batch_size`. Where the meaning differs (a ratio where
ditty counts steps, an accumulation count where ditty keeps the global batch), the note says how.
"""

from __future__ import annotations

from typing import Optional

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
