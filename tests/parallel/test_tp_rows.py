"""The rows that read more than per-token log-probabilities, under tensor parallel at tp 2 x dp 2 (4 real
gloo processes) against one process:

- online pairs (sampled with generate on the sharded policy, paired, scored on vocabulary shards; tied
  groups dropped, so a micro-batch may hold only filler pairs);
- GKD, the teacher split like the student and the divergence summed on vocabulary shards
  (ditty.objectives.jsd_shards): data-only steps, on-policy steps with the hard-label term, and the
  teacher's mistakes corrected from the data;
- IPO, SimPO, ORPO and KTO at tp 2 (DPO's tests are in test_tp_preference.py);
- the reward model (a sequence classifier: its score head replicated and run sequence parallel), whose
  gathered weights load into AutoModelForSequenceClassification and score as the one-process model's
  (docs/scale/parallel.md's `ditty run tiny_reward ... --parallel.tp 2` runs in the docs test).

Each row's losses over 3 steps agree within 1e-5 and its weights after them within 1e-5 (the
sums over vocabulary and sequence pieces round differently from the whole ones).
"""

from __future__ import annotations

import pytest

from tests.objectives import test_distill, test_online_pairs
from tests.objectives.row_workers import assert_trains_alike, row_steps
from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

STEPS = 3


def online_pairs_recipe(tmp_path, model):
    # judged by length, so some groups tie and are dropped; one generate call per prompt (a call's samples
    # depend on the prompts it holds, and the data-parallel ranks hold halves)
    extra = 'generation_batch_size = 1\nrewards = ["tests.rl.rewards_for_tests:length_reward"]'
    path = test_online_pairs.recipe(tmp_path, model, data_format="prompt", extra=extra)
    path.write_text(path.read_text().replace('[peft]\nkind = "lora"', '[peft]\nkind = "none"'))
    return path


def distill_recipe(tmp_path, teacher, extra):
    path = test_distill.distill_recipe(tmp_path, teacher, extra)
    path.write_text(path.read_text().replace("global_batch_size = 8", "global_batch_size = 16"))
    return path


RECIPES = {
    "online-pairs": online_pairs_recipe,
    "gkd-data-steps": lambda t, m: distill_recipe(t, m, "data_only_steps = 3\nbeta = 0.5\nsft_weight = 0.5"),
    "gkd-on-policy": lambda t, m: distill_recipe(t, m, "data_only_steps = 0\nbeta = 0.5\nsft_weight = 0.5"),
    "gkd-teacher-mistakes": lambda t, m: distill_recipe(t, m, 'data_only_steps = 0\nteacher_mistakes = "data"'),
}


@pytest.mark.parametrize("row", sorted(RECIPES))
def test_the_row_at_tp_2_by_dp_2_trains_as_one_process(tmp_path, tiny_llama_dir, row):
    recipe = str(RECIPES[row](tmp_path, tiny_llama_dir))
    (one,) = run_ranks(row_steps, 1, recipe, "none", str(tmp_path / "one"), STEPS, timeout=400)
    four = run_ranks(row_steps, 4, recipe, "fsdp", str(tmp_path / "four"), STEPS, 2, timeout=400)
    assert len(set(one["losses"])) == STEPS  # it trains
    assert all(rank["losses"] == four[0]["losses"] for rank in four)
    for a, b in zip(one["losses"], four[0]["losses"]):
        assert abs(a - b) < 1e-5, (one["losses"], four[0]["losses"])
    assert [m.keys() for m in four[0]["metrics"]] == [m.keys() for m in one["metrics"]]
    if row == "online-pairs":
        assert 0 < min(m["online/tied_groups"] for m in one["metrics"]) < 1  # some groups pair, some tie
    if row.startswith("gkd"):
        shares = [m["distill/on_policy_share"] for m in four[0]["metrics"]]
        assert shares == [m["distill/on_policy_share"] for m in one["metrics"]]
        assert (max(shares) > 0) == (row != "gkd-data-steps")  # the on-policy rows sample
    if row == "gkd-teacher-mistakes":
        corrected = [m["distill/corrected"] for m in one["loss_metrics"]]
        assert max(corrected) > 0
        assert [m["distill/corrected"] for m in four[0]["loss_metrics"]] == pytest.approx(corrected, abs=1e-6)
    worst = max(float((one["state"][k] - four[0]["state"][k]).abs().max()) for k in one["state"])
    assert worst < 1e-5, worst


@pytest.mark.parametrize("kind", ["ipo", "simpo", "orpo", "kto"])
def test_the_rest_of_the_dpo_family_at_tp_2_trains_as_one_process(tmp_path, tiny_llama_dir, kind):
    """IPO (the completions' lengths), SimPO and ORPO (no reference) and KTO (unpaired examples, its KL
    baseline), full finetunes (IPO's and KTO's reference a frozen copy split like the policy), at tp 2,
    beside DPO's tests in test_tp_preference.py."""
    from tests.parallel.test_cp_rows import recipe

    written = recipe(tmp_path, tiny_llama_dir, kind, "none")
    # Adam moves a weight whose gradient is near 0 by about lr whatever its rounding: at 1e-3 one element
    # of IPO's down_proj differs by 2.8e-5 after 3 steps (2.8e-6 at 1e-4; the losses agree to 2e-6 at both)
    written.write_text(written.read_text().replace("lr = 1e-3", "lr = 1e-4"))
    path = str(written)
    (one,) = run_ranks(row_steps, 1, path, "none", str(tmp_path / "one"), STEPS, timeout=400)
    two = run_ranks(row_steps, 2, path, "fsdp", str(tmp_path / "two"), STEPS, 2, timeout=400)
    assert len(set(one["losses"])) == STEPS
    assert_trains_alike(one, two[0])


def test_the_reward_model_at_tp_2_by_dp_2_trains_as_one_process(tmp_path, tiny_llama_dir):
    """Its final weights load into AutoModelForSequenceClassification and score as one process's."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from tests.parallel.test_cp_rows import recipe

    path = recipe(tmp_path, tiny_llama_dir, "dpo", "none")
    text = path.read_text().replace(f'path = "{tiny_llama_dir}"', f'path = "{tiny_llama_dir}"\ntask = "reward-model"')
    path.write_text(text[: text.index("[preference]")] + "[logging]\nprogress = false\n")
    (one,) = run_ranks(row_steps, 1, str(path), "none", str(tmp_path / "one"), STEPS, timeout=400)
    four = run_ranks(row_steps, 4, str(path), "fsdp", str(tmp_path / "four"), STEPS, 2, timeout=400)
    assert len(set(one["losses"])) == STEPS
    assert_trains_alike(one, four[0], metric="rewards/margins")
    config = AutoConfig.from_pretrained(tiny_llama_dir, num_labels=1)
    scores = []
    for state in (one["state"], four[0]["state"]):
        model = AutoModelForSequenceClassification.from_config(config)
        model.load_state_dict(state)  # the gathered weights under the classifier's own names, every one
        texts = torch.tensor([[1, 60, 50, 43, 61, 2], [1, 61, 43, 61, 51, 2]])
        with torch.no_grad():
            scores.append(model(texts).logits.flatten().tolist())
    assert model.score.weight.shape == (1, 64) and scores[1] == pytest.approx(scores[0], abs=1e-5)
