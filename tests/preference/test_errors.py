"""Bad preference input is exit code 2 naming the file and line or the recipe key, with nothing on disk lost."""

from __future__ import annotations

import os

from ditty.cli import main
from tests.preference.recipes import PAIRS, preference_recipe, write_pairs


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _tree(path):
    return sorted((p, os.path.getsize(os.path.join(p, f))) for p, _, files in os.walk(path) for f in files)


def test_a_pair_without_rejected_names_its_file_and_line(capsys, tmp_path, tiny_llama_dir):
    data = write_pairs(tmp_path / "pairs.jsonl", PAIRS[:2] + [{"prompt": "1+1=", "chosen": "2"}] + PAIRS[2:])
    recipe = preference_recipe(tmp_path, tiny_llama_dir, data)
    before = (_tree(tmp_path), _tree(tiny_llama_dir))
    code, out = run_cli(capsys, "run", recipe)
    assert code == 2, out
    assert f"{data}:3" in out and "'rejected' is missing" in out
    assert "Traceback" not in out
    assert not (tmp_path / "run" / "final").exists()
    assert _tree(tiny_llama_dir) == before[1]  # the model and the data are untouched
    assert open(data).read().count("\n") == len(PAIRS) + 1


def test_an_unknown_preference_kind_lists_the_kinds(capsys, tmp_path, tiny_llama_dir):
    recipe = preference_recipe(
        tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra='[preference]\nkind = "rlhf"'
    )
    code, out = run_cli(capsys, "check", recipe)
    assert code == 2, out
    assert "preference.kind" in out and all(kind in out for kind in ("dpo", "ipo", "simpo", "orpo", "kto"))


def test_a_reference_path_that_does_not_exist(capsys, tmp_path, tiny_llama_dir):
    extra = f'[preference]\nreference = "{tmp_path / "no" / "such" / "model"}"'
    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra=extra)
    code, out = run_cli(capsys, "check", recipe)
    assert code == 2, out
    assert "preference.reference" in out and "does not exist" in out
    assert not (tmp_path / "run").exists()


def test_kind_and_format_must_match_and_simpo_takes_no_reference(capsys, tmp_path, tiny_llama_dir):
    data = write_pairs(tmp_path / "p.jsonl")
    recipe = preference_recipe(tmp_path, tiny_llama_dir, data, extra='[preference]\nkind = "kto"')
    code, out = run_cli(capsys, "check", recipe)
    assert code == 2 and 'reads data.format = "unpaired_preference"' in out, out
    recipe = preference_recipe(tmp_path, tiny_llama_dir, data, extra='[preference]\nkind = "simpo"\nreference = "auto"')
    code, out = run_cli(capsys, "check", recipe)
    assert code == 2 and "reference-free" in out, out
    recipe = preference_recipe(tmp_path, tiny_llama_dir, data, extra='[preference]\nkind = "ipo"\nbeta = 0.5')
    code, out = run_cli(capsys, "check", recipe)
    assert code == 0, out


def test_deepspeed_zero3_is_refused_with_the_reason(capsys, tmp_path, tiny_llama_dir):
    extra = '[parallel]\nkind = "deepspeed"\nzero_stage = 3'
    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra=extra)
    code, out = run_cli(capsys, "check", recipe)
    assert code == 2, out
    assert "parallel.zero_stage" in out and "ZeRO-3" in out and "zero_stage = 2" in out
    assert "Traceback" not in out


def _reference_with_another_tokenizer(path, added: int) -> str:
    """A tiny Llama whose tokenizer is the byte tokenizer with `added` more tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    tokenizer.add_tokens([f"<extra{i}>" for i in range(added)])
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_a_reference_with_another_tokenizer_is_refused(capsys, tmp_path, tiny_llama_dir):
    other = _reference_with_another_tokenizer(tmp_path / "other", added=37)  # 296 ids against the policy's 259
    extra = f'[preference]\nreference = "{other}"'
    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra=extra)
    code, out = run_cli(capsys, "run", recipe)
    assert code == 2 and "Traceback" not in out, out
    assert "preference.reference" in out and "has another tokenizer than the policy's (296 ids against" in out, out
    assert not (tmp_path / "run" / "final").exists()


def test_a_reference_without_a_tokenizer_and_too_few_embeddings_is_refused(capsys, caplog, tmp_path, tiny_llama_dir):
    import shutil

    short = _reference_with_another_tokenizer(tmp_path / "short", added=0)
    for name in os.listdir(short):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            os.remove(os.path.join(short, name))
    shutil.copytree(short, tmp_path / "same")  # 259 rows: the policy's ids fit, so it is taken
    from transformers import AutoConfig, AutoModelForCausalLM

    small = AutoConfig.from_pretrained(short)
    small.vocab_size = 46
    AutoModelForCausalLM.from_config(small).save_pretrained(short)
    extra = f'[preference]\nreference = "{short}"'
    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra=extra)
    code, out = run_cli(capsys, "run", recipe)
    assert code == 2 and "has 46 token embeddings and the policy's tokenizer 259 ids" in out, out
    recipe = preference_recipe(
        tmp_path,
        tiny_llama_dir,
        write_pairs(tmp_path / "p.jsonl"),
        extra=f'[preference]\nreference = "{tmp_path / "same"}"',
    )
    code, out = run_cli(capsys, "run", recipe)
    assert code == 0, out
    assert "holds no tokenizer files, so its vocabulary cannot be compared with the policy's" in caplog.text


def test_a_reference_that_is_not_a_causal_lm_is_refused_by_check(capsys, tmp_path, tiny_llama_dir):
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text('{"model_type": "t5", "vocab_size": 259}')
    extra = f'[preference]\nreference = "{t5}"'
    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra=extra)
    code, out = run_cli(capsys, "check", recipe)
    assert code == 2 and "`preference.reference`" in out and "is a t5 model that is not a causal LM" in out, out


def test_sft_weight_with_simpo_says_simpo_takes_no_nll_term(capsys, tmp_path, tiny_llama_dir):
    extra = '[preference]\nkind = "simpo"\nsft_weight = 1.0'
    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"), extra=extra)
    code, out = run_cli(capsys, "check", recipe)
    assert code == 0, out
    assert '`preference.sft_weight` has no effect with kind = "simpo" (SIMPO takes no NLL term)' in out, out
    assert "ORPO" not in out


def test_a_preference_kind_on_a_supervised_recipe_has_no_effect(capsys):
    code, out = run_cli(capsys, "check", "tiny_sft", "--preference.kind", "dpo")
    assert code == 0, out
    assert '`preference.kind` has no effect: this recipe trains "supervised"' in out, out
    assert "does not read [preference] (set by --preference.kind)" in out, out
