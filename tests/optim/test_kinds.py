"""Muon (with AdamW), Adafactor and schedule-free AdamW; parameter groups (no_decay, lr_multipliers).

Muon's part must be torch.optim.Muon's arithmetic exactly; which tensor goes to Muon is checked on a
tiny Llama and a tiny BERT classifier, by name.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

from ditty.config.sections import OptimizerConfig
from ditty.optim import build_optimizer
from ditty.optim.groups import ParamInfo, check_patterns, group_parameters, module_parameters


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        num_labels=3,
    )
    return BertForSequenceClassification(config)


def muon_names(model, opt=OptimizerConfig(kind="muon")) -> set[str]:
    optimizer = build_optimizer(opt, model)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for g in optimizer.param_groups if g["algorithm"] == "muon" for p in g["params"]}


def test_muon_takes_the_hidden_matrices_of_a_llama():
    model = tiny_llama()
    projections = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    projections += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    expected = {f"model.layers.{i}.{p}.weight" for i in range(2) for p in projections}
    assert muon_names(model) == expected  # not embed_tokens, lm_head, the norms


def test_muon_takes_the_hidden_matrices_of_a_bert_classifier():
    model = tiny_bert()
    linears = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"]
    linears += ["intermediate.dense", "output.dense"]
    expected = {f"bert.encoder.layer.{i}.{name}.weight" for i in range(2) for name in linears}
    # not the three embedding tables, the LayerNorms, biases, the pooler outside the blocks, the classifier
    assert muon_names(model) == expected


def test_muon_with_lora_takes_the_adapter_matrices():
    from ditty.config.sections import PeftConfig
    from ditty.models.adapters import LoraConverter

    model = LoraConverter(PeftConfig(kind="lora", r=4, target_modules=["q_proj", "v_proj"])).convert(tiny_llama())
    names = muon_names(model)
    assert len(names) == 2 * 2 * 2 and all(".lora_A." in n or ".lora_B." in n for n in names)


def test_muon_part_equals_torch_muon_and_adamw_part_equals_torch_adamw():
    """Three steps with the same gradients: the composite against torch's two optimizers, 1e-6. In
    bfloat16, torch's own Newton-Schulz; the float32 one "auto" takes on this CPU is checked against it
    in tests/optim/test_newton_schulz.py."""
    model = tiny_llama()
    reference = copy.deepcopy(model)
    opt = OptimizerConfig(
        kind="muon", lr=1e-3, weight_decay=0.1, muon_lr=0.05, muon_momentum=0.9, ns_steps=4, ns_dtype="bfloat16"
    )
    optimizer = build_optimizer(opt, model)
    matrix = "model.layers.1.mlp.down_proj.weight"
    ref = dict(reference.named_parameters())
    torch_muon = torch.optim.Muon(
        [ref[matrix]], lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True, ns_steps=4, adjust_lr_fn="original"
    )
    torch_adamw = torch.optim.AdamW([ref["lm_head.weight"]], lr=1e-3, weight_decay=0.1, betas=(0.9, 0.999))
    initial = ref[matrix].detach().clone()
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(0, 64, (2, 8), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        for name, parameter in model.named_parameters():
            ref[name].grad = parameter.grad.clone()
        optimizer.step()
        torch_muon.step()
        torch_adamw.step()
        optimizer.zero_grad()
    live = dict(model.named_parameters())
    torch.testing.assert_close(live[matrix], ref[matrix], rtol=0, atol=1e-6)
    torch.testing.assert_close(live["lm_head.weight"], ref["lm_head.weight"], rtol=0, atol=1e-6)
    assert (live[matrix] - initial).abs().max() > 1e-3  # Muon moved it


def test_one_state_dict_and_one_schedule_for_both_parts():
    from ditty.config.sections import SchedulerConfig
    from ditty.optim import build_scheduler

    model = tiny_llama()
    optimizer = build_optimizer(OptimizerConfig(kind="muon", lr=1e-3, muon_lr=0.02), model)
    scheduler = build_scheduler(SchedulerConfig(kind="linear", warmup_steps=2), optimizer, total_steps=10)
    rates = {g["algorithm"]: g["lr"] for g in optimizer.param_groups}
    assert rates == {"adamw": pytest.approx(1e-3 / 2), "muon": pytest.approx(0.02 / 2)}  # warmup's first step
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    state = optimizer.state_dict()
    kinds = {frozenset(s) for s in state["state"].values()}
    assert kinds == {frozenset({"momentum_buffer"}), frozenset({"step", "exp_avg", "exp_avg_sq"})}
    assert [g["algorithm"] for g in state["param_groups"]] == [g["algorithm"] for g in optimizer.param_groups]


def _saved(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _steps(model, optimizer, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 64, (2, 8), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("kind", ["radam", "muon", "adafactor", "adamw_schedulefree"])
def test_state_round_trips_bitwise(kind):
    config = OptimizerConfig(kind=kind, weight_decay=0.1)
    model = tiny_llama()
    optimizer = build_optimizer(config, model)
    if kind == "adamw_schedulefree":
        optimizer.train()
    _steps(model, optimizer, 2, seed=0)
    saved_model, saved_state = _saved(model.state_dict()), _saved(optimizer.state_dict())
    _steps(model, optimizer, 2, seed=1)

    resumed = tiny_llama()
    resumed.load_state_dict(saved_model)
    resumed_optimizer = build_optimizer(config, resumed)
    resumed_optimizer.load_state_dict(saved_state)
    _steps(resumed, resumed_optimizer, 2, seed=1)
    for name, value in model.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def test_schedule_free_switches_between_training_and_evaluation_weights():
    from ditty.optim.schedule_free import evaluation_weights, train_mode

    model = tiny_llama()
    optimizer = build_optimizer(OptimizerConfig(kind="adamw_schedulefree", lr=1e-2), model)
    train_mode(optimizer)
    _steps(model, optimizer, 3, seed=0)
    y = {n: p.detach().clone() for n, p in model.named_parameters()}
    with evaluation_weights(optimizer):
        x = {n: p.detach().clone() for n, p in model.named_parameters()}
        assert not all(optimizer_group["train_mode"] for optimizer_group in optimizer.param_groups)
    assert any(not torch.equal(x[n], y[n]) for n in y)  # eval weights are the average, not y
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.detach(), y[name], rtol=0, atol=1e-6)
    with evaluation_weights(torch.optim.SGD(model.parameters(), lr=0.1)):  # an optimizer without modes: no-op
        pass


def test_no_decay_defaults_biases_norms_embeddings():
    model = tiny_bert()
    optimizer = build_optimizer(OptimizerConfig(weight_decay=0.1), model)
    names = {id(p): n for n, p in model.named_parameters()}
    undecayed = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    decayed = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    assert "bert.embeddings.word_embeddings.weight" in undecayed
    assert "bert.embeddings.position_embeddings.weight" in undecayed
    assert "bert.encoder.layer.0.attention.output.LayerNorm.weight" in undecayed
    assert "bert.encoder.layer.0.attention.self.query.bias" in undecayed
    assert decayed == {n for n in names.values() if n.endswith(".weight") and n not in undecayed}
    assert "classifier.weight" in decayed and "bert.pooler.dense.weight" in decayed


def test_no_decay_patterns_replace_the_default():
    model = tiny_llama()
    optimizer = build_optimizer(OptimizerConfig(weight_decay=0.1, no_decay=["bias", "mlp"]), model)
    names = {id(p): n for n, p in model.named_parameters()}
    undecayed = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert undecayed == {n for n in names.values() if ".mlp." in n}  # the model has no biases; norms now decay


def test_lr_multipliers_first_matching_pattern_wins():
    model = tiny_llama()
    opt = OptimizerConfig(lr=1e-3, lr_multipliers={"lm_head": 10.0, "head": 3.0, "norm": 0.5})
    optimizer = build_optimizer(opt, model)
    names = {id(p): n for n, p in model.named_parameters()}
    rate = {names[id(p)]: g["lr"] for g in optimizer.param_groups for p in g["params"]}
    assert rate["lm_head.weight"] == pytest.approx(1e-2)
    assert rate["model.norm.weight"] == pytest.approx(5e-4)
    assert rate["model.layers.0.self_attn.q_proj.weight"] == pytest.approx(1e-3)


def test_lora_plus_style_multiplier_for_b_matrices():
    from ditty.config.sections import PeftConfig
    from ditty.models.adapters import LoraConverter

    model = LoraConverter(PeftConfig(kind="lora", r=4)).convert(tiny_llama())
    optimizer = build_optimizer(OptimizerConfig(lr=1e-4, lr_multipliers={"lora_B": 16.0}), model)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        expected = 1.6e-3 if all("lora_B" in names[id(p)] for p in group["params"]) else 1e-4
        assert group["lr"] == pytest.approx(expected)
    assert {round(g["lr"], 8) for g in optimizer.param_groups} == {1e-4, 1.6e-3}


def test_roles_of_a_tied_head_and_groups_count_parameters():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, tie_word_embeddings=True)
    )
    roles = {info.name: info.role for info, _ in module_parameters(model)}
    assert roles["model.embed_tokens.weight"] == "embedding" and "lm_head.weight" not in roles
    groups = group_parameters([info for info, _ in module_parameters(model)], OptimizerConfig(kind="muon"))
    assert sum(g.numel for g in groups) == sum(p.numel() for p in model.parameters())


def test_bad_patterns_are_compile_problems():
    problems = check_patterns(OptimizerConfig(no_decay=["(unclosed"], lr_multipliers={"head": 0.0}))
    assert [p.key for p in problems] == ["optimizer.no_decay", "optimizer.lr_multipliers"]


def test_a_tensor_outside_numbered_blocks_never_goes_to_muon():
    from ditty.optim.groups import takes_muon

    assert takes_muon(ParamInfo("model.layers.3.mlp.up_proj.weight", (8, 4), "linear"))
    assert not takes_muon(ParamInfo("model.layers.3.mlp.up_proj.bias", (8,), "bias"))
    t5_bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    assert not takes_muon(ParamInfo(t5_bias, (32, 4), "embedding"))
    assert not takes_muon(ParamInfo("model.layers.0.experts.w1", (4, 8, 8), "other"))  # 3-D: AdamW
    assert not takes_muon(ParamInfo("classifier.weight", (3, 8), "linear"))


def test_a_pattern_that_matches_no_parameter_is_warned_about_by_name(caplog):
    model = tiny_llama()
    opt = OptimizerConfig(weight_decay=0.1, no_decay=["bias", "nrom", "embedding"], lr_multipliers={"lora_b": 16.0})
    with caplog.at_level("WARNING", logger="ditty.optim"):
        build_optimizer(opt, model)
    warned = [record.getMessage() for record in caplog.records if record.name == "ditty.optim"]
    assert len(warned) == 2, warned  # "bias" is a role this model has no tensor of: not a typo, no warning
    assert "optimizer.no_decay pattern 'nrom' matches no trainable parameter" in warned[0]
    assert "optimizer.lr_multipliers pattern 'lora_b' matches no trainable parameter" in warned[1]
    assert "model.embed_tokens.weight" in warned[0]  # names some parameters, so a fix is in reach


def test_check_warns_about_a_pattern_that_matches_no_tensor(capsys):
    from ditty.cli import main

    assert main(["check", "tiny_sft", "--optimizer.no_decay", '["nrom", "embedding"]']) == 0
    out = capsys.readouterr().out
    assert "optimizer.no_decay pattern 'nrom' matches no trainable parameter" in out


def test_radam_is_torchs_with_decoupled_weight_decay_and_takes_small_first_steps():
    """RAdam is torch.optim.RAdam with AdamW's weight decay, group for group; its first step moves the
    weights by a fraction of what Adam's first step (every weight by the whole rate) does."""
    config = OptimizerConfig(kind="radam", lr=1e-3, weight_decay=0.1)
    model, reference = tiny_llama(), tiny_llama()
    reference.load_state_dict(model.state_dict())
    optimizer = build_optimizer(config, model)
    groups = [
        {**g, "params": [dict(reference.named_parameters())[n] for n in _names(model, g)]}
        for g in optimizer.param_groups
    ]
    expected = torch.optim.RAdam(groups, lr=1e-3, decoupled_weight_decay=True)
    _steps(model, optimizer, 3, seed=0)
    _steps(reference, expected, 3, seed=0)
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference.state_dict()[name]), name

    adam, radam = tiny_llama(), tiny_llama()
    radam.load_state_dict(adam.state_dict())
    start = {n: p.detach().clone() for n, p in adam.named_parameters()}
    _steps(adam, build_optimizer(OptimizerConfig(kind="adamw", lr=1e-3), adam), 1, seed=0)
    _steps(radam, build_optimizer(OptimizerConfig(kind="radam", lr=1e-3), radam), 1, seed=0)
    moved = {
        name: torch.cat([(dict(m.named_parameters())[n] - start[n]).abs().flatten() for n in start])
        for name, m in (("adam", adam), ("radam", radam))
    }
    # sign(g) x lr: every weight with a gradient by the whole rate (embedding rows of absent tokens have none)
    assert moved["adam"].max().item() == pytest.approx(1e-3, rel=1e-3)
    assert moved["radam"].mean() < 0.1 * moved["adam"].mean(), {k: v.mean().item() for k, v in moved.items()}


def _names(model, group) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for p in group["params"]]
