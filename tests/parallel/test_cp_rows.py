"""Post-training rows under context parallel, each rank holding a piece of every row (ditty.data.
context_shard). The DPO family: each completion's log-probability is the sum of its pieces over the
context ranks (ditty.objectives.context_rows), the reference's too. GKD on the data's completions: the
teacher runs on the same pieces (Ulysses attention, split like the student) and the divergence is a
sum over each piece's tokens. Against one process over 3 steps, the losses, the loss's metrics and
the weights after them agree within 1e-5:

- DPO as a full finetune (the reference a frozen copy split like the policy) at dp 2 x cp 2, 4 real
  gloo processes;
- DPO with LoRA (the reference: the base with the adapter disabled) at cp 2;
- ORPO (no reference; the completions' lengths summed over the pieces too) at cp 2;
- KTO with LoRA on unpaired examples (examples counted once per row, its KL baseline from whole rows)
  at cp 2;
- the reward model at dp 2 x cp 2 and at tp 2 x cp 2 (each row's score read from the piece that holds
  its last token);
- GKD (distill.lmbda = 0, the teacher's mistakes corrected from the data) at dp 2 x cp 2.

Precomputed references and the rows that sample stay refused under cp
(tests/parallel/test_tp_preference.py).
"""

from __future__ import annotations

import pytest

from tests.objectives import test_distill
from tests.objectives.row_workers import assert_trains_alike, row_steps
from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

STEPS = 3


def kto_rows(path):
    """Unpaired examples of the addition task: a right sum is desirable, a wrong one is not."""
    import json

    rows = []
    for i in range(64):
        a, b = 17 * i % 89, 31 * i % 97
        right = i % 2 == 0
        rows.append({"prompt": f"{a}+{b}=", "completion": str(a + b if right else a + b + 1 + i % 7), "label": right})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def uneven_pairs(path):
    """Pairs whose chosen completion is short and rejected one long: the chosen rows end in the first
    piece of a row cut in two, the rejected ones in the second."""
    import json

    rows = []
    for i in range(64):
        a, b = 17 * i % 89, 31 * i % 97
        wrong = f"{a + b + 1 + i % 7}, since {a} and {b} make that many when added together"
        rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": wrong})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def recipe(tmp_path, model, kind: str, peft: str):
    path = tmp_path / f"{kind}.toml"
    data = 'source = "builtin"\nname = "addition"\nformat = "preference"\nnum_samples = 200'
    if kind == "kto":
        data = f'source = "file"\npath = "{kto_rows(tmp_path / "kto.jsonl")}"\nformat = "unpaired_preference"'
    path.write_text(
        f"""
[run]
output_dir = "{tmp_path / "run"}"
device = "cpu"
seed = 0
[model]
path = "{model}"
[data]
{data}
max_seq_len = 32
val_fraction = 0
[train]
steps = {STEPS}
global_batch_size = 8
micro_batch_size = 2
log_every = 1
eval_samples = 0
precision = "fp32"
[optimizer]
lr = 1e-3
[peft]
kind = "{peft}"
r = 4
alpha = 8
[preference]
kind = "{kind}"
sft_weight = {0.5 if kind == "dpo" else 0.0}
[logging]
progress = false
"""
    )
    return path


@pytest.mark.parametrize(
    "kind, peft, processes",
    [("dpo", "none", 4), ("dpo", "lora", 2), ("orpo", "none", 2), ("kto", "lora", 2)],
    ids=["dpo-full-dp2-cp2", "dpo-lora-cp2", "orpo-cp2", "kto-lora-cp2"],
)
def test_the_dpo_family_under_cp_trains_as_one_process(tmp_path, tiny_llama_dir, kind, peft, processes):
    path = str(recipe(tmp_path, tiny_llama_dir, kind, peft))
    (one,) = run_ranks(row_steps, 1, path, "none", str(tmp_path / "one"), STEPS, timeout=400)
    split = run_ranks(row_steps, processes, path, "fsdp", str(tmp_path / "cp"), STEPS, 1, 2, timeout=400)
    assert len(set(one["losses"])) == STEPS  # it trains
    assert all(rank["losses"] == split[0]["losses"] for rank in split)
    assert_trains_alike(one, split[0], metric="rewards/margins")


@pytest.mark.parametrize("tp", [1, 2], ids=["dp2-cp2", "tp2-cp2"])
def test_the_reward_model_under_cp_trains_as_one_process(tmp_path, tiny_llama_dir, tp):
    """Each row's score is its last token's, read from whichever piece holds it: the chosen rows end in
    the first piece, the rejected ones in the second. With tp too, the score head's scores are gathered
    over the tensor-parallel ranks first."""
    path = recipe(tmp_path, tiny_llama_dir, "dpo", "none")
    text = path.read_text().replace(f'path = "{tiny_llama_dir}"', f'path = "{tiny_llama_dir}"\ntask = "reward-model"')
    data = f'source = "file"\npath = "{uneven_pairs(tmp_path / "pairs.jsonl")}"\nformat = "preference"'
    text = text.replace('source = "builtin"\nname = "addition"\nformat = "preference"\nnum_samples = 200', data)
    path.write_text(text[: text.index("[preference]")] + "[logging]\nprogress = false\n")
    (one,) = run_ranks(row_steps, 1, str(path), "none", str(tmp_path / "one"), STEPS, timeout=400)
    split = run_ranks(row_steps, 4, str(path), "fsdp", str(tmp_path / "cp"), STEPS, tp, 2, timeout=400)
    assert len(set(one["losses"])) == STEPS
    assert_trains_alike(one, split[0], metric="rewards/margins")


def test_gkd_on_the_data_under_cp_trains_as_one_process(tmp_path, tiny_llama_dir):
    path = test_distill.distill_recipe(tmp_path, tiny_llama_dir, 'teacher_mistakes = "data"\nsft_weight = 0.5')
    path.write_text(path.read_text().replace("lmbda = 0.5", "lmbda = 0.0"))
    (one,) = run_ranks(row_steps, 1, str(path), "none", str(tmp_path / "one"), STEPS, timeout=400)
    split = run_ranks(row_steps, 4, str(path), "fsdp", str(tmp_path / "cp"), STEPS, 1, 2, timeout=400)
    assert len(set(one["losses"])) == STEPS
    for a, b in zip(one["losses"], split[0]["losses"]):
        assert abs(a - b) < 1e-5, (one["losses"], split[0]["losses"])
    assert max(m["distill/corrected"] for m in one["loss_metrics"]) > 0  # some tokens learn the data's
    worst = max(float((one["state"][k] - split[0]["state"][k]).abs().max()) for k in one["state"])
    assert worst < 1e-5, worst
