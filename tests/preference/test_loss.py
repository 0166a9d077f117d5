"""One trainer step on a fixed batch gives each kind's formula, computed here in plain torch from full
logits of the policy and of a DIFFERENT reference checkpoint; any cut into micro-batches gives the same
loss; the adapter's reference is the base model with no second copy."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ditty.config import TrainerConfig
from ditty.config.preference import PreferenceConfig
from ditty.config.sections import DataConfig, LoggingConfig, ModelConfig, OptimizerConfig, RunConfig, TrainConfig
from ditty.train import Trainer

PAIRS = [
    {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 7 * (b + 1))}
    for a in range(5, 9)
    for b in range(2)
]
UNPAIRED = [
    {"prompt": f"{a}+{b}=", "completion": str(a + b + (0 if b else 3)), "label": b == 1}
    for a in range(5, 9)
    for b in range(2)
]
BETA = 0.3


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory, tiny_llama_dir):
    """The tiny Llama with every weight moved: a different checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    path = tmp_path_factory.mktemp("reference")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(path)
    return str(path)


def _config(tmp_path, model_dir, kind, reference=None, **preference) -> TrainerConfig:
    rows, fmt = (UNPAIRED, "unpaired_preference") if kind == "kto" else (PAIRS, "preference")
    data = tmp_path / f"{kind}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pref = PreferenceConfig(kind=kind, beta=BETA, **preference)
    if reference is not None:
        pref = replace(pref, reference=reference)
    return TrainerConfig(
        run=RunConfig(output_dir=str(tmp_path / f"run-{kind}"), seed=0, device="cpu"),
        model=ModelConfig(path=model_dir),
        data=DataConfig(source="file", path=str(data), format=fmt, max_seq_len=32, val_fraction=0),
        train=TrainConfig(steps=2, global_batch_size=8, micro_batch_size=8, log_every=1, precision="fp32"),
        optimizer=OptimizerConfig(lr=1e-3),
        logging=LoggingConfig(progress=False),
        preference=pref,
    )


def _fixed_batch(trainer) -> tuple[list[dict], dict]:
    bundle = trainer.data.bundle
    samples = [bundle.train[i] for i in range(len(bundle.train))]
    return samples, bundle.collator(samples)


def _full_logits_logps(model, ids_labels) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch: one sequence at a time (no padding), full logits, log_softmax, gather."""
    sums, lengths = [], []
    with torch.no_grad():
        for ids, labels in ids_labels:
            ids, labels = torch.tensor([ids]), torch.tensor(labels[1:])
            logps = F.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
            scored = labels != -100
            sums.append(logps[scored].gather(1, labels[scored, None]).sum())
            lengths.append(scored.sum().double())
    return torch.stack(sums), torch.stack(lengths)


def _formula(kind, policy, reference, lengths, labels=None, gamma=0.5):
    if kind == "kto":
        ratio = policy - reference
        z = ratio.mean().clamp(min=0)
        desirable = torch.tensor(labels, dtype=torch.bool)
        losses = torch.where(desirable, 1 - torch.sigmoid(BETA * (ratio - z)), 1 - torch.sigmoid(BETA * (z - ratio)))
        return losses.mean()
    n = len(policy) // 2
    pc, pr, lc, lr = policy[:n], policy[n:], lengths[:n], lengths[n:]
    if kind in ("dpo", "ipo"):
        rc, rr = reference[:n], reference[n:]
        if kind == "dpo":
            return -F.logsigmoid(BETA * ((pc - rc) - (pr - rr))).mean()
        return (((pc - rc) / lc - (pr - rr) / lr - 1 / (2 * BETA)) ** 2).mean()
    chosen, rejected = pc / lc, pr / lr
    if kind == "simpo":
        return -F.logsigmoid(BETA * (chosen - rejected) - gamma).mean()
    log_odds = (chosen - rejected) - (torch.log(1 - torch.exp(chosen)) - torch.log(1 - torch.exp(rejected)))
    return (-chosen).mean() - BETA * F.logsigmoid(log_odds).mean()


def _sequences(samples, kind):
    if kind == "kto":
        return [(s["input_ids"], s["labels"]) for s in samples]
    chosen = [(s["input_ids"], s["labels"]) for s in samples]
    return chosen + [(s["rejected_input_ids"], s["rejected_labels"]) for s in samples]


@pytest.mark.parametrize("kind", ["dpo", "ipo", "simpo", "orpo", "kto"])
def test_one_step_equals_the_formula_with_a_different_reference(tmp_path, tiny_llama_dir, reference_dir, kind):
    from transformers import AutoModelForCausalLM

    free = kind in ("simpo", "orpo")
    trainer = Trainer(_config(tmp_path, tiny_llama_dir, kind, None if free else reference_dir))
    samples, batch = _fixed_batch(trainer)
    sequences = _sequences(samples, kind)
    policy, lengths = _full_logits_logps(trainer.model, sequences)
    reference = None
    if not free:
        reference, _ = _full_logits_logps(AutoModelForCausalLM.from_pretrained(reference_dir).eval(), sequences)
        assert not torch.allclose(policy, reference, atol=1e-3)  # the reference really differs
    labels = [s["label"] for s in samples] if kind == "kto" else None
    expected = float(_formula(kind, policy, reference, lengths, labels))
    out = trainer.train_step([batch])
    assert out.loss == pytest.approx(expected, abs=1e-6)
    if kind in ("dpo", "ipo"):  # TRL's metrics: the policy's mean chosen log-probability, the reward margin
        n = len(samples)
        assert out.metrics["logps/chosen"] == pytest.approx(float(policy[:n].mean()), abs=1e-5)
        margins = BETA * ((policy[:n] - reference[:n]) - (policy[n:] - reference[n:]))
        assert out.metrics["rewards/margins"] == pytest.approx(float(margins.mean()), abs=1e-6)
        assert out.metrics["rewards/accuracies"] == pytest.approx(float((margins > 0).double().mean()))


@pytest.mark.parametrize("kind", ["dpo", "orpo"])
def test_micro_batches_of_2_and_8_pairs_give_the_same_loss(tmp_path, tiny_llama_dir, reference_dir, kind):
    trainer = Trainer(_config(tmp_path, tiny_llama_dir, kind, None if kind == "orpo" else reference_dir))
    samples, _ = _fixed_batch(trainer)
    collate = trainer.data.bundle.collator
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    results = {}
    for micro in (8, 2):
        trainer.model.load_state_dict(weights)
        out = trainer.train_step([collate(samples[i : i + micro]) for i in range(0, len(samples), micro)])
        results[micro] = (out.loss, out.grad_norm, out.metrics["rewards/margins"])
    assert results[2][0] == pytest.approx(results[8][0], abs=1e-6)
    assert results[2][1] == pytest.approx(results[8][1], abs=1e-5)
    assert results[2][2] == pytest.approx(results[8][2], abs=1e-6)


def test_adapter_reference_is_the_base_model_without_a_copy(tmp_path, tiny_llama_dir):
    from ditty.config.sections import PeftConfig
    from ditty.objectives.reference import AdapterDisabled

    config = replace(_config(tmp_path, tiny_llama_dir, "dpo"), peft=PeftConfig(kind="lora", r=4, alpha=8))
    trainer = Trainer(config)
    reference = trainer.pipeline.loss.reference
    assert isinstance(reference, AdapterDisabled)
    policy_params = {id(p) for p in trainer.model.parameters()}
    assert {id(p) for p in reference.model.parameters()} <= policy_params  # the same tensors: no second copy
    samples, batch = _fixed_batch(trainer)
    for _ in range(2):  # the adapter moves away from the base; the reference stays the base
        trainer.train_step([batch])
    from transformers import AutoModelForCausalLM

    base, _ = _full_logits_logps(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), _sequences(samples, "dpo"))
    assert torch.allclose(reference(batch).double(), base, atol=1e-4)
    policy, _ = _full_logits_logps(trainer.model, _sequences(samples, "dpo"))
    assert not torch.allclose(policy, base, atol=1e-3)


def test_dpo_with_sft_weight_adds_the_chosen_completions_mean_token_nll(tmp_path, tiny_llama_dir, reference_dir):
    from transformers import AutoModelForCausalLM

    trainer = Trainer(_config(tmp_path, tiny_llama_dir, "dpo", reference_dir, sft_weight=0.7))
    samples, batch = _fixed_batch(trainer)
    sequences = _sequences(samples, "dpo")
    policy, lengths = _full_logits_logps(trainer.model, sequences)
    reference, _ = _full_logits_logps(AutoModelForCausalLM.from_pretrained(reference_dir).eval(), sequences)
    n = len(samples)
    expected = _formula("dpo", policy, reference, lengths) + 0.7 * (-policy[:n] / lengths[:n]).mean()
    out = trainer.train_step([batch])
    assert out.loss == pytest.approx(float(expected), abs=1e-6)
    assert out.metrics["nll_loss"] == pytest.approx(float((-policy[:n] / lengths[:n]).mean()), abs=1e-6)


def test_kto_with_one_label_class_warns_and_logs_nothing_for_the_other(tmp_path, tiny_llama_dir, caplog):
    config = _config(tmp_path, tiny_llama_dir, "kto")
    only_desirable = [dict(row, label=True) for row in UNPAIRED]
    with open(config.data.path, "w") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in only_desirable))
    with caplog.at_level("WARNING", logger="ditty.data"):
        trainer = Trainer(config)
    assert "all 8 training examples are desirable (label true)" in caplog.text, caplog.text
    _, batch = _fixed_batch(trainer)
    out = trainer.train_step([batch])
    assert "rewards/chosen" in out.metrics
    assert "rewards/rejected" not in out.metrics and "logps/rejected" not in out.metrics  # not a made-up 0.0
    assert "rewards/margins" not in out.metrics
