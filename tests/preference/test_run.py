"""`ditty run` of a LoRA DPO recipe: TRL's metric names in metrics.jsonl, their val_ versions on held-out
pairs, and a final/ adapter whose model card names the method."""

from __future__ import annotations

import json

from ditty.cli import main
from tests.preference.recipes import preference_recipe, write_pairs

TRL_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def test_lora_dpo_run_logs_trl_metrics_and_names_the_method(capsys, tmp_path, tiny_llama_dir):
    extra = '[peft]\nkind = "lora"\nr = 4\nalpha = 8\n\n[preference]\nkind = "dpo"\nbeta = 0.2\nsft_weight = 0.5'
    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra=extra, steps=3)
    recipe.write_text(
        recipe.read_text()
        .replace("val_fraction = 0", "val_fraction = 0.25")
        .replace("log_every = 1", "log_every = 1\neval_every = 3")
    )
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and all(f"val_{name}" in records[0] for name in TRL_METRICS)  # the baseline
    assert all(name in [r for r in records if "loss" in r][0] for name in TRL_METRICS)
    assert all(f"val_{name}" in records[-1] for name in TRL_METRICS)
    assert 0.0 <= records[-1]["val_rewards/accuracies"] <= 1.0 and "val_perplexity" not in records[-1]
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "DPO (beta 0.2, reference auto, sft_weight 0.5)" in card
    from peft import AutoPeftModelForCausalLM

    assert AutoPeftModelForCausalLM.from_pretrained(tmp_path / "run" / "final") is not None
