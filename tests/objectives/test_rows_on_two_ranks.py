"""The new objective rows on 2 ranks (real gloo processes, DDP and FSDP2) train as 1 process: the same
rows draw the same samples (seeded by their global positions), and each step's loss and the weights
after three steps agree to 1e-6. On-policy distillation samples half its steps; online pairs drop tied
groups, so the ranks hold different numbers of pairs and the loss must count them globally; RLOO's
baseline reads the rewards of the whole group, gathered across ranks."""

from __future__ import annotations

import pytest

from tests.objectives import test_distill, test_online_pairs
from tests.objectives.row_workers import row_steps
from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

STEPS = 3


def distill_recipe(tmp_path, teacher, extra=""):
    # lmbda 0.5; two micro-batches per rank: the samples' seeds count the rank's share and the micro-batch
    path = test_distill.distill_recipe(tmp_path, teacher, "data_only_steps = 0\n" + extra)
    path.write_text(path.read_text().replace("global_batch_size = 8", "global_batch_size = 16"))
    return path


def distill_data_recipe(tmp_path, teacher):
    # the random teacher's argmax is rarely the data's token: most data tokens score the cross-entropy
    return distill_recipe(tmp_path, teacher, 'teacher_mistakes = "data"')


def online_recipe(tmp_path, model):
    # Prompts judged by length: a group whose four samples all reach max_new_tokens ties and is dropped,
    # so the ranks hold different numbers of pairs. One generate call per prompt: a call's samples depend
    # on the prompts it holds, and the ranks hold halves.
    extra = 'generation_batch_size = 1\nrewards = ["tests.rl.rewards_for_tests:length_reward"]'
    return test_online_pairs.recipe(tmp_path, model, data_format="prompt", extra=extra)


def rloo_recipe(tmp_path, model):
    path = tmp_path / "rloo.toml"
    text = test_online_pairs.recipe(tmp_path, model, data_format="prompt").read_text()
    text = text.replace('[preference]\nkind = "dpo"\npairs = "online"\n', "")
    text = text.replace(
        "[rl]\n",
        '[rl]\nkind = "grpo"\nadvantage = "rloo"\ngeneration_batch_size = 1\n'
        'rewards = ["tests.rl.rewards_for_tests:length_reward"]\n',
    )
    path.write_text(text)
    return path


RECIPES = {
    "distill": distill_recipe,
    "distill-data": distill_data_recipe,
    "online-pairs": online_recipe,
    "rloo": rloo_recipe,
}


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
@pytest.mark.parametrize("row", sorted(RECIPES))
def test_two_ranks_train_the_row_as_one_process(tmp_path, tiny_llama_dir, row, kind):
    recipe = str(RECIPES[row](tmp_path, tiny_llama_dir))
    (one,) = run_ranks(row_steps, 1, recipe, "none", str(tmp_path / "one"), STEPS, timeout=400)
    two = run_ranks(row_steps, 2, recipe, kind, str(tmp_path / "two"), STEPS, timeout=400)
    assert two[0]["losses"] == two[1]["losses"]
    # the same samples: the same pairs, rewards, on-policy steps (timings aside)
    assert without_timings(two[0]["metrics"]) == without_timings(one["metrics"])
    assert len(set(one["losses"])) == STEPS  # it trains
    if row == "online-pairs":
        assert 0 < min(m["online/tied_groups"] for m in one["metrics"]) < 1  # some groups pair, some tie
    if row.startswith("distill"):
        assert 0 < one["metrics"][-1]["distill/on_policy_share"] < 1  # steps on the data's answers and on samples
    if row == "distill-data":  # the share of tokens that learned the data's token: micro-batch means, averaged
        corrected = [m["distill/corrected"] for m in one["loss_metrics"]]
        assert max(corrected) > 0.5
        assert [m["distill/corrected"] for m in two[0]["loss_metrics"]] == pytest.approx(corrected, abs=1e-9)
    for a, b in zip(one["losses"], two[0]["losses"]):
        assert abs(a - b) < 1e-6, (one["losses"], two[0]["losses"])
    worst = max(float((one["state"][k] - two[0]["state"][k]).abs().max()) for k in one["state"])
    assert worst < 1e-6, worst


def without_timings(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("rollout/")} for m in metrics]
