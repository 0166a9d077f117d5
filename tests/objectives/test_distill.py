"""The distillation row (`[distill] kind = "gkd"`): the chunked generalised JSD equals TRL's dense one,
its gradient too; a student trains from a teacher on its own samples; bad settings are exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main
from ditty.objectives.jsd import chunked_jsd
from ditty.stages.fused_loss import Projection

VOCAB, HIDDEN = 37, 16


def dense_reference(student_logits, teacher_logits, labels, beta, temperature):
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    return GKDTrainer.generalized_jsd_loss(
        student_logits[:, :-1], teacher_logits[:, :-1], labels[:, 1:], beta=beta, temperature=temperature
    )


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_chunked_divergence_equals_trls_dense_one(beta, temperature):
    g = torch.Generator().manual_seed(0)
    student_hidden = torch.randn(3, 9, HIDDEN, generator=g, dtype=torch.float64, requires_grad=True)
    teacher_hidden = torch.randn(3, 9, HIDDEN, generator=g, dtype=torch.float64)
    student_weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64, requires_grad=True)
    teacher_weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
    labels = torch.randint(0, VOCAB, (3, 9), generator=g)
    labels[:, :3] = -100  # the prompt
    labels[2, 6:] = -100  # padding

    sums = chunked_jsd(
        student_hidden, Projection(student_weight), teacher_hidden, Projection(teacher_weight), labels,
        beta=beta, temperature=temperature, chunks=3,
    )  # fmt: skip
    ours, count = sums.divergence / sums.tokens, sums.tokens
    ours.backward()
    got = (student_hidden.grad.clone(), student_weight.grad.clone())
    student_hidden.grad = student_weight.grad = None

    dense = dense_reference(
        student_hidden @ student_weight.T, teacher_hidden @ teacher_weight.T, labels, beta, temperature
    )
    dense.backward()
    assert float(ours.detach()) == pytest.approx(float(dense.detach()), abs=1e-6, rel=0)
    torch.testing.assert_close(got[0], student_hidden.grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(got[1], student_weight.grad, atol=1e-6, rtol=0)
    assert int(count) == int((labels[:, 1:] != -100).sum())


def test_forward_and_reverse_kl_at_the_ends():
    """beta 0 is KL(teacher || student), beta 1 is KL(student || teacher)."""
    from ditty.objectives.jsd import jsd_per_token

    student, teacher = torch.randn(4, VOCAB, dtype=torch.float64), torch.randn(4, VOCAB, dtype=torch.float64)
    p, q = teacher.softmax(-1), student.softmax(-1)
    forward = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(jsd_per_token(student, teacher, 0.0).double(), forward, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        jsd_per_token(student, teacher, 1.0).double(), (q * (q.log() - p.log())).sum(-1), atol=1e-6, rtol=0
    )


def test_the_hard_label_term_is_the_students_cross_entropy_on_the_data_rows_only():
    """`distill.sft_weight`'s term: the dense cross-entropy of the rows marked as the data's, summed;
    rows the student sampled add nothing to it, and the divergence is the same with or without it."""
    g = torch.Generator().manual_seed(1)
    student_hidden = torch.randn(3, 9, HIDDEN, generator=g, dtype=torch.float64)
    teacher_hidden = torch.randn(3, 9, HIDDEN, generator=g, dtype=torch.float64)
    student_weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
    teacher_weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
    labels = torch.randint(0, VOCAB, (3, 9), generator=g)
    labels[:, :2] = -100
    labels[1, 7:] = -100
    data_rows = torch.tensor([True, False, True])
    heads = Projection(student_weight), teacher_hidden, Projection(teacher_weight), labels

    divergence, cross_entropy, count, corrected = chunked_jsd(
        student_hidden, *heads, beta=0.5, temperature=0.7, chunks=4, data_rows=data_rows, cross_entropy=True
    )
    plain, nothing, _, _ = chunked_jsd(student_hidden, *heads, beta=0.5, temperature=0.7, chunks=4)

    logits = (student_hidden @ student_weight.T)[data_rows, :-1]
    dense = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), labels[data_rows, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )
    assert float(cross_entropy) == pytest.approx(float(dense), abs=1e-9, rel=0)
    assert float(nothing) == 0.0 and float(divergence) == pytest.approx(float(plain), abs=1e-12, rel=0)
    assert int(count) == int((labels[:, 1:] != -100).sum())  # the divergence still covers every row
    assert float(corrected) == 0.0  # the teacher's mistakes are followed unless asked otherwise


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_not_following_the_teachers_mistakes_scores_the_data_token_where_the_teacher_prefers_another(beta):
    """`distill.teacher_mistakes = "data"`: on the data rows, a token where the teacher's argmax is
    not the label scores the student's cross-entropy instead of the divergence; every other token,
    and every token of the rows the student sampled, the divergence. Sum and gradients against a
    dense per-token computation."""
    from ditty.objectives.jsd import jsd_per_token

    g = torch.Generator().manual_seed(2)
    student_hidden = torch.randn(3, 9, HIDDEN, generator=g, dtype=torch.float64, requires_grad=True)
    teacher_hidden = torch.randn(3, 9, HIDDEN, generator=g, dtype=torch.float64)
    student_weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64, requires_grad=True)
    teacher_weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
    teacher_logits = teacher_hidden @ teacher_weight.T
    labels = torch.randint(0, VOCAB, (3, 9), generator=g)
    labels[:, 1:5] = teacher_logits[:, :4].argmax(-1)  # the teacher right on these tokens, wrong (mostly) after
    labels[:, :2] = -100
    labels[2, 7:] = -100
    data_rows = torch.tensor([True, True, False])  # row 2: the student's own sample

    sums = chunked_jsd(
        student_hidden, Projection(student_weight), teacher_hidden, Projection(teacher_weight), labels,
        beta=beta, temperature=0.8, chunks=4, data_rows=data_rows, follow_teacher_mistakes=False,
    )  # fmt: skip
    sums.divergence.backward()
    got = (student_hidden.grad.clone(), student_weight.grad.clone())
    student_hidden.grad = student_weight.grad = None

    logits, teacher, target = (student_hidden @ student_weight.T)[:, :-1], teacher_logits[:, :-1], labels[:, 1:]
    scored = target != -100
    mistakes = scored & data_rows[:, None] & (teacher.argmax(-1) != target)
    divergence = jsd_per_token(logits[scored], teacher[scored], beta, 0.8)
    cross_entropy = torch.nn.functional.cross_entropy(logits[scored], target[scored], reduction="none")
    dense = torch.where(mistakes[scored], cross_entropy, divergence).sum()
    dense.backward()
    assert 0 < int(mistakes.sum()) < int(scored[:2].sum())  # some tokens corrected, not all of the data rows'
    assert (scored[2] & (teacher[2].argmax(-1) != target[2])).any()  # the sampled row has mistakes, left alone
    assert int(sums.corrected) == int(mistakes.sum())
    assert float(sums.divergence.detach()) == pytest.approx(float(dense.detach()), abs=1e-9, rel=0)
    torch.testing.assert_close(got[0], student_hidden.grad, atol=1e-9, rtol=0)
    torch.testing.assert_close(got[1], student_weight.grad, atol=1e-9, rtol=0)


STUDENT = (
    '[model]\ninit = "random"\narchitecture = "llama"\n'
    "config = { hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1, num_attention_heads = 2, "
    "num_key_value_heads = 2, max_position_embeddings = 64, tie_word_embeddings = false }\n"
    '[tokenizer]\nkind = "byte"\n'
)


def distill_recipe(tmp_path, teacher, extra=""):
    recipe = tmp_path / "distill.toml"
    recipe.write_text(
        f"""
[run]
output_dir = "{tmp_path / "run"}"
device = "cpu"
seed = 0
{STUDENT}
[data]
source = "builtin"
name = "addition"
format = "prompt_completion"
max_seq_len = 32
num_samples = 300
[train]
steps = 3
global_batch_size = 8
micro_batch_size = 4
log_every = 1
eval_samples = 16
precision = "fp32"
[logging]
progress = false
[distill]
kind = "gkd"
teacher = "{teacher}"
lmbda = 0.5
{extra}
[rollout]
max_new_tokens = 4
"""
    )
    return recipe


def test_a_student_trains_from_a_teacher_on_its_own_samples(tmp_path, tiny_llama_dir, capsys):
    """With the hard-label term: its cross-entropy counts on the steps that read the data's
    completions, never on the steps the student sampled itself."""
    recipe = distill_recipe(tmp_path, tiny_llama_dir, "beta = 0.5\nsft_weight = 0.5")
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 3 and all(r["loss"] > 0 for r in steps)
    assert 0 < steps[-1]["distill/on_policy_share"] < 1  # some steps on the student's samples, some on the data's
    on_policy_so_far = [round(r["distill/on_policy_share"] * (i + 1)) for i, r in enumerate(steps)]
    sampled = [now > before for before, now in zip([0, *on_policy_so_far], on_policy_so_far)]
    assert [r["distill/cross_entropy"] > 0 for r in steps] == [not s for s in sampled]
    for r in steps:  # the logged loss is the divergence plus half the cross-entropy, both per token
        assert r["loss"] == pytest.approx(r["distill/divergence"] + 0.5 * r["distill/cross_entropy"], rel=1e-4)
    assert "val_exact_match" in records[-1]
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "distilled from" in card and "cross-entropy weight 0.5" in card


def test_held_out_the_student_reports_its_cross_entropy_beside_the_divergence(tmp_path, tiny_llama_dir, capsys):
    """Without the hard-label term training logs the divergence alone; the evaluation adds the student's
    cross-entropy on the held-out completions (val_distill/cross_entropy), which reads as plain SFT's
    val_loss does, while val_loss stays the divergence being minimised."""
    recipe = distill_recipe(tmp_path, tiny_llama_dir)
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not any("distill/cross_entropy" in r for r in records if "loss" in r)
    evaluated = [r for r in records if "val_loss" in r]
    assert evaluated
    for r in evaluated:
        assert r["val_distill/cross_entropy"] > 0
        assert r["val_loss"] == pytest.approx(r["val_distill/divergence"], rel=1e-5)
        assert r["val_distill/cross_entropy"] != pytest.approx(r["val_loss"], rel=1e-3)


@pytest.mark.parametrize(
    "flags, key, words",
    [
        (["--distill.beta", "1.5"], "distill.beta", "in [0, 1]"),
        (["--distill.lmbda", "-0.1"], "distill.lmbda", "in [0, 1]"),
        (["--distill.sft_weight", "-1"], "distill.sft_weight", "0 or more"),
        (["--distill.data_only_steps", "-1"], "distill.data_only_steps", "0 or more"),
        (["--data.format", "text"], "data.format", "reads prompts and completions"),
        (["--data.packing", "true"], "data.packing", "packed rows hold several"),
    ],
)
def test_bad_distill_settings_are_exit_2(tmp_path, tiny_llama_dir, capsys, flags, key, words):
    code = main(["check", str(distill_recipe(tmp_path, tiny_llama_dir)), *flags])
    out = capsys.readouterr()
    assert code == 2 and f"`{key}`" in out.err + out.out and words in out.err + out.out


@pytest.mark.parametrize(
    "setting, key", [("sft_weight = 0.5", "sft_weight"), ('teacher_mistakes = "data"', "teacher_mistakes")]
)
def test_a_data_completion_setting_without_data_steps_is_a_warning(tmp_path, tiny_llama_dir, capsys, setting, key):
    recipe = distill_recipe(tmp_path, tiny_llama_dir, setting)
    code = main(["check", str(recipe), "--distill.lmbda", "1"])
    out = capsys.readouterr()
    assert code == 0 and f"`distill.{key}`" in out.err + out.out and "has no effect" in out.err + out.out


def test_a_student_that_does_not_follow_the_teachers_mistakes_logs_what_it_corrected(tmp_path, tiny_llama_dir, capsys):
    """A random teacher disagrees with most of the data's tokens: the steps on the data's completions
    log a share of corrected tokens, the steps on the student's samples none."""
    recipe = distill_recipe(tmp_path, tiny_llama_dir, 'teacher_mistakes = "data"')
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    on_policy_so_far = [round(r["distill/on_policy_share"] * (i + 1)) for i, r in enumerate(steps)]
    sampled = [now > before for before, now in zip([0, *on_policy_so_far], on_policy_so_far)]
    assert sampled.count(False) and sampled.count(True)
    assert all((r["distill/corrected"] > 0) != s for r, s in zip(steps, sampled))
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "cross-entropy on the data's token where the teacher's argmax is another" in card


def test_the_hard_label_term_and_not_following_the_teacher_add_up(tmp_path, tiny_llama_dir, capsys):
    """Both: a token where the teacher is wrong scores its cross-entropy in the divergence and again,
    times sft_weight, in the hard-label term."""
    recipe = distill_recipe(tmp_path, tiny_llama_dir, 'sft_weight = 0.5\nteacher_mistakes = "data"')
    assert main(["run", str(recipe), "--distill.lmbda", "0"]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert all(r["distill/corrected"] > 0.5 for r in steps)  # a random teacher: most tokens are its mistakes
    for r in steps:
        assert r["loss"] == pytest.approx(r["distill/divergence"] + 0.5 * r["distill/cross_entropy"], rel=1e-4)
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "cross-entropy weight 0.5, cross-entropy on the data's token where the teacher's argmax is another" in card


def test_an_unknown_teacher_mistakes_setting_is_exit_2(tmp_path, tiny_llama_dir, capsys):
    code = main(["check", str(distill_recipe(tmp_path, tiny_llama_dir, 'teacher_mistakes = "ignore"'))])
    out = capsys.readouterr()
    assert code == 2 and "teacher_mistakes" in out.err + out.out


def test_an_unknown_teacher_mistakes_setting_from_python_is_a_compiler_error(tmp_path, tiny_llama_dir):
    """The TOML loader checks the Literal; a DistillConfig built in Python meets the compiler's type check."""
    from dataclasses import replace

    from ditty.config.loader import load_recipe
    from ditty.recipe.compiler import compile_config

    config = load_recipe(str(distill_recipe(tmp_path, tiny_llama_dir))).config
    config = replace(config, distill=replace(config.distill, teacher_mistakes="Data"))
    errors = compile_config(config).errors
    assert [p.key for p in errors] == ["distill.teacher_mistakes"] and "is not a valid choice" in errors[0].message
    assert errors[0].fix == 'did you mean "data"?'


def test_the_first_data_only_steps_never_sample(tmp_path, tiny_llama_dir, capsys):
    recipe = distill_recipe(tmp_path, tiny_llama_dir, "data_only_steps = 2")
    assert main(["run", str(recipe), "--distill.lmbda", "1"]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["distill/on_policy_share"] for r in records if "loss" in r]
    assert shares == [0.0, 0.0, pytest.approx(1 / 3)]  # steps 1 and 2 read the data; step 3 samples
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "on-policy share 1 after 2 steps on the data's completions" in card


def test_data_only_steps_that_cover_the_run_are_a_warning(tmp_path, tiny_llama_dir, capsys):
    code = main(["check", str(distill_recipe(tmp_path, tiny_llama_dir, "data_only_steps = 3"))])
    out = capsys.readouterr()
    assert code == 0 and "`distill.data_only_steps`" in out.err + out.out and "no step samples" in out.err + out.out


def test_a_missing_teacher_is_exit_2(tmp_path, capsys):
    code = main(["check", str(distill_recipe(tmp_path, tmp_path / "no_such_teacher"))])
    out = capsys.readouterr()
    assert code == 2 and "`distill.teacher`" in out.err + out.out


def test_a_teacher_that_is_not_a_causal_lm_is_refused_by_check(tmp_path, capsys):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text('{"model_type": "bert", "architectures": ["BertForSequenceClassification"]}')
    code = main(["check", str(distill_recipe(tmp_path, bert))])
    out = capsys.readouterr()
    text = out.err + out.out
    assert code == 2 and "`distill.teacher`" in text and "is a bert model that is not a causal LM" in text, text


def test_a_teacher_that_cannot_load_is_exit_2_naming_distill_teacher(tmp_path, tiny_llama_dir, capsys):
    import shutil

    teacher = tmp_path / "no_weights"
    shutil.copytree(tiny_llama_dir, teacher)
    (teacher / "model.safetensors").unlink()
    code = main(["run", str(distill_recipe(tmp_path, teacher))])
    out = capsys.readouterr()
    text = out.err + out.out
    assert code == 2 and "`distill.teacher` cannot load a model from directory" in text, text
    assert "`model.path`" not in text and "Traceback" not in text


def test_a_teacher_of_another_vocabulary_is_exit_2(tmp_path, capsys):
    from tests.conftest import _save_tiny

    teacher = _save_tiny(tmp_path / "other", "llama", vocab_size=300)
    code = main(["run", str(distill_recipe(tmp_path, teacher))])
    out = capsys.readouterr()
    assert code == 2 and "one vocabulary" in out.err + out.out


def test_the_students_samples_are_cut_to_max_seq_len_with_their_prompt(tiny_llama_dir):
    """A `rollout.max_new_tokens` beyond data.max_seq_len makes no longer rows than the data's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ditty._utils.labels import IGNORE_INDEX
    from ditty.config.rollout import RolloutConfig
    from ditty.objectives.gkd import OnPolicyStream
    from ditty.objectives.sampling.generate_sampler import GenerateSampler

    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
        AutoTokenizer.from_pretrained(tiny_llama_dir),
    )
    settings = RolloutConfig(max_new_tokens=20)
    sampler = GenerateSampler(lambda: model, settings, 1, tokenizer, torch.device("cpu"), seed=0)
    stream = OnPolicyStream(None, sampler, None, 0, tokenizer.pad_token_id, rank=0, micro_batch_size=2, max_seq_len=10)
    prompts = [tokenizer("12+3=")["input_ids"], tokenizer("7=")["input_ids"]]
    rows = [p + [tokenizer.eos_token_id] for p in prompts]  # each row's one label is its end: the prompt is before it
    width = max(len(r) for r in rows)
    batch = {
        "input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
        "labels": torch.tensor(
            [[IGNORE_INDEX] * (len(r) - 1) + [r[-1]] + [IGNORE_INDEX] * (width - len(r)) for r in rows]
        ),
    }
    out = stream.sampled(batch, 0)
    assert out["input_ids"].shape[1] == 10  # the 20 sampled tokens of the longer row, cut with its prompt
    scored = (out["labels"] != IGNORE_INDEX).sum(dim=1).tolist()
    assert scored == [10 - len(p) for p in prompts], scored


@pytest.fixture(scope="module")
def finished_sft(tmp_path_factory):
    """A finished 2-step SFT run of a tiny Llama with the byte tokenizer: final/ with its manifest."""
    from tests.reliability.helpers import ditty, write_recipe

    tmp = tmp_path_factory.mktemp("sft")
    result = ditty("run", str(write_recipe(tmp, steps=3)))
    assert result.code == 0, result.err[-3000:]
    return tmp / "run" / "final"


@pytest.fixture(scope="module")
def reward_model_final(tmp_path_factory):
    """A reward model's final/ (LlamaForSequenceClassification, the byte tokenizer) from a 2-step run."""
    from tests.reliability.helpers import ditty
    from tests.reward.helpers import reward_recipe

    tmp = tmp_path_factory.mktemp("reward")
    result = ditty("run", reward_recipe(tmp, steps=2))
    assert result.code == 0, result.err[-3000:]
    return tmp / "run" / "final"


def test_a_reward_models_final_is_refused_as_a_teacher(tmp_path, reward_model_final):
    """Its config's model_type is a causal LM's (llama), its head is not: loaded as a causal LM it got
    a random lm_head, and the student distilled noise."""
    from tests.reliability.helpers import ditty, no_traceback

    recipe = str(distill_recipe(tmp_path, reward_model_final))
    for command in ("check", "run"):
        result = ditty(command, recipe)
        assert result.code == 2 and no_traceback(result), result.err[-3000:]
        assert "`distill.teacher`" in result.err and "LlamaForSequenceClassification" in result.err, result.err
    assert not (tmp_path / "run" / "final").exists()


def test_a_damaged_teacher_is_refused_before_it_teaches(tmp_path, finished_sft):
    """A teacher with a manifest (a run's final/) is verified as ditty generate verifies one: damaged
    weights gave NaN every step and a stop that blamed the learning rate."""
    import shutil

    from tests.reliability.helpers import ditty, no_traceback, overwrite

    teacher = tmp_path / "teacher"
    shutil.copytree(finished_sft, teacher)
    overwrite(teacher / "model.safetensors", 5_000)
    result = ditty("run", str(distill_recipe(tmp_path, teacher)))
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    assert "`distill.teacher`" in result.err and "is damaged: model.safetensors" in result.err, result.err
    assert "learning rate" not in result.err


def test_a_teacher_that_is_neither_a_directory_nor_on_the_hub_is_named_at_once(tmp_path, monkeypatch):
    """A hub-shaped path that is no directory, with the offline switch off (the suite sets it): exit 2
    naming distill.teacher after one connection attempt where the Hub cannot be reached (as here), not
    a minute of retries ending in "set model.path"; where it can, its answer (no such model) at once."""
    import time

    import datasets.config
    import huggingface_hub.constants

    from tests.reliability.helpers import ditty, no_traceback

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    started = time.monotonic()
    result = ditty("run", str(distill_recipe(tmp_path, "teachers/addition")))
    assert time.monotonic() - started < 20
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    assert "`distill.teacher`" in result.err and "model.path" not in result.err, result.err
