"""Every metrics.jsonl key is defined in one registry (ditty.metrics.glossary), which docs/metrics.md
is rendered from: short runs of the bundled SFT (with and without multi-token heads), DPO and GRPO
recipes log only keys the registry defines, and so do the objectives' loss functions on the paths a
short run does not take (IPO, SimPO, ORPO, KTO, sequence-level GRPO with a KL term, the sampler
mismatch, tool errors)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from ditty.metrics import glossary
from tests.objectives.pinned_runs import COMMON, RUNS

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--train.steps", "2", "--train.eval_every", "2", "--scheduler.warmup_steps", "1"]
SFT = ["tiny_sft", "--data.num_samples", "400", "--train.eval_samples", "16"]
# Each run: the recipe and its flags (the bundled post-training recipes start from a tiny Llama).
METRIC_RUNS = {
    "tiny_sft": SFT,
    "tiny_sft_mtp": [*SFT, "--mtp.depth", "2"],
    "tiny_dpo": [*RUNS["dpo"][:1], "--train.eval_samples", "16"],
    "tiny_grpo": [*RUNS["grpo"][:1], "--train.eval_samples", "16"],
}
STARTS_FROM_A_MODEL = {"tiny_dpo", "tiny_grpo"}


@pytest.mark.parametrize("name", sorted(METRIC_RUNS))
def test_a_short_run_logs_only_keys_the_glossary_defines(name, tmp_path, tiny_llama_dir):
    from ditty.cli import main

    recipe, *flags = METRIC_RUNS[name]
    if name in STARTS_FROM_A_MODEL:
        flags += ["--model.path", tiny_llama_dir]
    threads = torch.get_num_threads()
    try:
        code = main(["run", recipe, "--run.output_dir", str(tmp_path / name), *COMMON, *SHORT, *flags])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    keys = {key for record in records for key in record}
    assert {"loss", "val_loss" if name != "tiny_grpo" else "val_reward"} <= keys, sorted(keys)
    assert not glossary.undefined(keys), (
        f"{name} logs keys docs/metrics.md does not define; add them to ditty/metrics/glossary.py: "
        f"{glossary.undefined(keys)}"
    )


def _pairs(n: int = 4):
    torch.manual_seed(0)
    logps = [-(torch.rand(n, dtype=torch.float64) * 5 + 1) for _ in range(4)]
    lengths = torch.tensor([3.0] * n, dtype=torch.float64)
    return logps, lengths


def test_every_preference_kind_logs_defined_keys_and_their_val_versions():
    from ditty.objectives import dpo_family as d

    (pc, pr, rc, rr), lengths = _pairs()
    outputs = [
        d.dpo_loss(pc, pr, rc, rr, global_pairs=4),
        d.ipo_loss(pc, pr, rc, rr, lengths, lengths, global_pairs=4),
        d.simpo_loss(pc, pr, lengths, lengths, global_pairs=4),
        d.orpo_loss(pc, pr, lengths, lengths, global_pairs=4),
        d.kto_loss(
            pc, rc, torch.tensor([True, False, True, False]), torch.tensor(0.1, dtype=torch.float64),
            global_examples=4, global_desirable=2, global_undesirable=2,
        ),
    ]  # fmt: skip
    keys = {key for out in outputs for key in out.metrics}
    assert {"log_odds_ratio", "kl", "nll_loss"} <= keys
    # validation averages a preference loss's own metrics over the held-out pairs as val_<name>
    assert not glossary.undefined(keys | {f"val_{key}" for key in keys})


def test_the_policy_loss_the_advantages_and_the_rollout_measures_log_defined_keys():
    from ditty.objectives.rewards.functions import reward_metrics
    from ditty.objectives.rl.grpo import completion_metrics, group_advantages, grpo_loss
    from ditty.objectives.rl.stream import mismatch_metrics
    from ditty.objectives.sampling.correction import mismatch_totals

    torch.manual_seed(0)
    logps = -torch.rand(4, 5, dtype=torch.float64)
    mask = torch.ones(4, 5, dtype=torch.bool)
    keys = set()
    for importance in ("token", "sequence"):
        out = grpo_loss(
            logps, logps - 0.3, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask, global_sequences=4, global_tokens=20,
            reference_logps=logps + 0.1, beta=0.04, importance=importance, loss="grpo",
        )  # fmt: skip
        keys |= set(out.metrics)
    keys |= set(group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2).metrics)
    shares, maxima = completion_metrics(torch.tensor([3, 5]), torch.tensor([False, True]), 2)
    keys |= set(shares) | set(maxima)
    keys |= set(
        reward_metrics(
            {"my_rewards:score": torch.tensor([1.0, 0.0])}, {"rewards/my_rewards:score/parsed": torch.tensor([1.0])}
        )
    )
    keys |= set(mismatch_metrics(mismatch_totals(logps, logps + 1e-6, mask), 1))
    assert {"kl", "clip_ratio/region_mean", "rollout/logprob_diff/max", "frac_reward_zero_std"} <= keys
    assert not glossary.undefined(keys)


def test_every_tool_error_and_episode_measure_is_defined():
    from ditty.objectives.environments.episodes import Episode, episode_metrics
    from ditty.objectives.environments.tools.builtin_tools import calculator
    from ditty.objectives.environments.tools.tool_environment import ToolEnvironment

    env = ToolEnvironment({"calculator": calculator})
    env.reset({"prompt": "1+1="})
    step = env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{oops</tool_call>')
    episode = Episode(row={}, environment=env, prompt_ids=[1], conversation=None, metrics=dict(step.metrics))
    keys = set(episode_metrics([episode]))
    assert {"env/tool_errors/unknown", "env/tool_errors/malformed", "env/tool_calls/calculator"} <= keys
    val_keys = {f"val_{key}" for key in keys if key.count("/") == 1}  # what held-out episodes report
    assert not glossary.undefined(keys | val_keys)


def test_the_registry_is_complete_and_the_page_shows_it():
    seen = set()
    for metric in glossary.GLOSSARY:
        assert metric.key not in seen, f"{metric.key} twice"
        seen.add(metric.key)
        assert metric.meaning and metric.unit and metric.when and metric.group in glossary.GROUPS, metric
    # a key your own code names is documented, but it defines nothing: a misspelt built-in key still fails
    assert not glossary.defines("my_loss_part") and not glossary.defines("val_rewards/choosen")
    assert (
        glossary.lookup("rewards/ditty.objectives.rewards.builtin_rewards:exact_match/mean").key == "rewards/NAME/mean"
    )
    assert glossary.lookup("runs/tiny_reward/final") is None
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert "<!-- ditty-metrics -->" in page
    table = glossary.markdown()
    for metric in glossary.GLOSSARY:
        assert f"| `{metric.key}` |" in table
    assert not re.search(r"^\| `(reward_std|elapsed_s|rollout/generate_s)` \|", page, re.M), (
        "docs/metrics.md renders the registry; write a key's meaning in ditty/metrics/glossary.py"
    )
