"""Chat data as users have it: OpenAI `messages` and ShareGPT `conversations` rows read as they are,
other layouts through `data.chat_keys`, and a row in neither layout a bad row named by file and line."""

from __future__ import annotations

import json

import pytest

from ditty.cli import main
from ditty.config.errors import RecipeError
from ditty.config.loader import parse_recipe
from ditty.config.sections import DataConfig
from ditty.data.build import build_data
from ditty.data.tokenizer import byte_tokenizer
from ditty.recipe import compile_recipe

OPENAI = [
    [("system", "be brief"), ("user", "2+2?"), ("assistant", "4")],
    [("user", "hi"), ("assistant", "hello"), ("user", "bye"), ("assistant", "ciao")],
    [("user", "3+1?"), ("assistant", "4")],
    [("user", "red?"), ("assistant", "a colour")],
]
SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}


def openai_row(turns) -> dict:
    return {"messages": [{"role": role, "content": text} for role, text in turns]}


def sharegpt_row(turns) -> dict:
    return {"conversations": [{"from": SHAREGPT_ROLE[role], "value": text} for role, text in turns]}


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def samples(path: str, **fields) -> list[tuple[list, list]]:
    config = DataConfig(source="file", path=path, format="chat", val_fraction=0.0, max_seq_len=64, **fields)
    train = build_data(config, byte_tokenizer(), seed=0).train
    return sorted((list(s["input_ids"]), list(s["labels"])) for s in train)


def test_sharegpt_rows_give_the_samples_of_the_same_openai_rows(tmp_path):
    openai = samples(write_jsonl(tmp_path / "openai.jsonl", [openai_row(t) for t in OPENAI]))
    sharegpt = samples(write_jsonl(tmp_path / "sharegpt.jsonl", [sharegpt_row(t) for t in OPENAI]))
    assert len(openai) == len(OPENAI) and sharegpt == openai
    supervised = [[t for t in labels if t != -100] for _, labels in openai]
    assert all(supervised)  # the assistant turns take loss, and the same ones in both layouts


def test_user_and_assistant_roles_in_a_sharegpt_file_and_a_json_array(tmp_path):
    rows = [{"conversations": [{"from": role, "value": text} for role, text in turns]} for turns in OPENAI]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(rows, indent=1))
    assert samples(str(path)) == samples(write_jsonl(tmp_path / "openai.jsonl", [openai_row(t) for t in OPENAI]))


def test_another_layout_through_chat_keys(tmp_path):
    names = {"system": "rules", "user": "customer", "assistant": "agent"}
    rows = [{"dialog": [{"speaker": names[role], "text": text} for role, text in turns]} for turns in OPENAI]
    keys = {"role": "speaker", "content": "text", **names}
    custom = samples(write_jsonl(tmp_path / "custom.jsonl", rows), messages_column="dialog", chat_keys=keys)
    assert custom == samples(write_jsonl(tmp_path / "openai.jsonl", [openai_row(t) for t in OPENAI]))


def test_a_row_in_neither_layout_is_a_bad_row_named_by_file_and_line(tmp_path):
    mixed = {"conversations": [{"from": "human", "value": "hi"}, {"role": "assistant", "content": "hello"}]}
    neither = {"chat": [{"speaker": "a", "text": "b"}]}
    rows = [openai_row(OPENAI[0]), mixed, sharegpt_row(OPENAI[1]), neither, sharegpt_row(OPENAI[2])]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    with pytest.raises(RecipeError) as caught:
        samples(path)
    message = str(caught.value)
    assert f"{path}:2" in message and "ShareGPT layout: from/value" in message
    assert f"{path}:4" in message and "'conversations' (ShareGPT layout)" in message
    assert "on_bad_rows" in message
    assert len(samples(path, on_bad_rows="skip")) == 3  # the three good rows, both layouts in one file


def test_an_assistant_turn_with_tool_calls_is_a_bad_row_not_an_empty_reply(tmp_path):
    """OpenAI's function-calling turns: the rendering carries content only, so a turn whose call is in
    `tool_calls` would train the model to answer with an empty turn."""
    call = [{"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]
    rows = [
        openai_row(OPENAI[0]),
        {"messages": [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": "", "tool_calls": call}]},
        {"messages": [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": None, "tool_calls": call}]},
    ]
    path = write_jsonl(tmp_path / "calls.jsonl", rows)
    with pytest.raises(RecipeError) as caught:
        samples(path)
    message = str(caught.value)
    for line in (2, 3):
        assert f"{path}:{line}" in message
    assert "message 1 (assistant) has 'tool_calls', which ditty's chat rendering does not carry" in message


def _problems(tmp_path, data: str, tokenizer: str = 'kind = "byte"') -> dict:
    head = f'[run]\noutput_dir = "{tmp_path}/run"\n[model]\narchitecture = "llama"\n[tokenizer]\n{tokenizer}\n'
    plan = compile_recipe(
        parse_recipe(head + "[train]\nsteps = 2\nglobal_batch_size = 2\nmicro_batch_size = 2\n" + data)
    )
    return {(p.key, p.severity): p for p in plan.problems}


def test_chat_keys_are_checked_and_ignored_outside_chat(tmp_path):
    ignored = _problems(tmp_path, '[data]\nformat = "prompt_completion"\nchat_keys = { role = "from" }\n')
    assert "no effect" in ignored[("data.chat_keys", "warning")].message
    wrong = _problems(tmp_path, '[data]\nformat = "chat"\nchat_keys = { speaker = "from" }\n')
    assert "unknown key 'speaker'" in wrong[("data.chat_keys", "error")].message
    assert ("data.chat_keys", "warning") not in _problems(
        tmp_path, '[data]\nformat = "chat"\nchat_keys = { role = "from" }\n'
    )


def test_a_parquet_row_in_neither_layout_is_a_bad_row_named_by_its_number(tmp_path):
    from datasets import Dataset

    rows = [sharegpt_row(OPENAI[0]), {"conversations": [{"speaker": "a", "text": "b"}]}, sharegpt_row(OPENAI[1])]
    path = str(tmp_path / "chat.parquet")
    Dataset.from_list(rows).to_parquet(path)
    with pytest.raises(RecipeError) as caught:
        samples(path)
    assert f"{path} row 2" in str(caught.value) and "neither 'role'/'content'" in str(caught.value)
    assert len(samples(path, on_bad_rows="skip")) == 2


@pytest.mark.parametrize("streaming", ["false", "true"])
def test_a_sharegpt_file_trains_two_steps(tmp_path, capsys, streaming):
    path = write_jsonl(tmp_path / "sharegpt.jsonl", [sharegpt_row(t) for t in OPENAI])
    out = tmp_path / "run"
    args = ["--data.source", "file", "--data.path", path, "--data.format", "chat", "--data.max_seq_len", "64"]
    args += ["--data.streaming", streaming]
    args += ["--data.val_fraction", "0", "--train.steps", "2", "--train.global_batch_size", "4"]
    args += ["--train.micro_batch_size", "4", "--train.eval_every", "0", "--scheduler.warmup_steps", "1"]
    args += ["--logging.progress", "false", "--run.output_dir", str(out)]
    assert main(["run", "tiny_sft", *args]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("step", 0) for r in records) == 2
    if streaming == "false":
        assert_generate_chat_uses_the_template(out, capsys)


def assert_generate_chat_uses_the_template(run, capsys) -> None:
    """`ditty generate --chat` feeds the model the user turn in the template, with its generation
    prompt and no second bos: the ids training saw before an assistant's answer."""
    import torch

    from ditty.train.generate import load_final

    capsys.readouterr()
    assert main(["generate", str(run), "--chat", "2+2?", "--max-new-tokens", "6"]) == 0
    answer = capsys.readouterr().out.rstrip("\n")
    model, tokenizer = load_final(str(run))
    turn = [{"role": "user", "content": "2+2?"}]
    ids = list(tokenizer.apply_chat_template(turn, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert tokenizer.decode(ids, skip_special_tokens=True).endswith("user: 2+2?\nassistant: ")
    assert ids.count(tokenizer.bos_token_id) == 1
    with torch.no_grad():
        output = model.generate(
            torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    new = output[0, len(ids) :].tolist()
    if tokenizer.eos_token_id in new:
        new = new[: new.index(tokenizer.eos_token_id)]
    assert answer == tokenizer.decode(new, skip_special_tokens=True)


ALPACA = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Name a colour.", "input": "", "output": "red"},
    {"instruction": "Say hi.", "output": "hi"},
]


def test_alpaca_rows_train_as_prompt_completion_through_the_template(tmp_path):
    path = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA)
    config = DataConfig(source="file", path=path, template="alpaca", val_fraction=0.0, max_seq_len=512)
    tokenizer = byte_tokenizer()
    texts = {}
    for sample in build_data(config, tokenizer, seed=0).train:
        ids, labels = list(sample["input_ids"]), list(sample["labels"])
        start = next(i for i, label in enumerate(labels) if label != -100)
        texts[tokenizer.decode(ids[:start], skip_special_tokens=True)] = tokenizer.decode(
            [t for t in labels if t != -100], skip_special_tokens=True
        )
    with_input = texts[
        "Below is an instruction that describes a task, paired with an input that provides further "
        "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
        "Add the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n"
    ]
    assert with_input == "5"
    plain = "Below is an instruction that describes a task. Write a response that appropriately completes the request."
    assert texts[f"{plain}\n\n### Instruction:\nName a colour.\n\n### Response:\n"] == "red"  # an empty input
    assert texts[f"{plain}\n\n### Instruction:\nSay hi.\n\n### Response:\n"] == "hi"  # no input at all


def test_alpaca_rows_without_output_name_the_template_and_line(tmp_path):
    path = write_jsonl(tmp_path / "alpaca.jsonl", [ALPACA[0], {"instruction": "x", "input": "y"}])
    with pytest.raises(RecipeError) as caught:
        build_data(DataConfig(source="file", path=path, template="alpaca", val_fraction=0.0), byte_tokenizer(), seed=0)
    assert f"{path}:2" in str(caught.value) and "'output' is missing" in str(caught.value)
    none = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(RecipeError) as caught:
        build_data(DataConfig(source="file", path=none, template="alpaca", val_fraction=0.0), byte_tokenizer(), seed=0)
    assert "`data.template`" in str(caught.value) and "'instruction' is missing" in str(caught.value)


def test_a_template_on_builtin_data_is_refused(tmp_path):
    problems = _problems(tmp_path, '[data]\ntemplate = "alpaca"\nprompt_column = "q"\n')
    assert "built-in 'addition' dataset" in problems[("data.template", "error")].message
    assert ("data.prompt_column", "warning") in problems
    assert ("data.template", "warning") in _problems(tmp_path, '[data]\nformat = "chat"\ntemplate = "alpaca"\n')


def test_a_tokenizer_without_a_chat_template_gets_a_named_one_or_a_jinja_file(tmp_path):
    from ditty.config.sections import ModelConfig, TokenizerConfig
    from ditty.data.chat_templates import CHATML
    from ditty.data.tokenizer import build_tokenizer

    bare = byte_tokenizer()
    bare.chat_template = None
    bare.save_pretrained(tmp_path / "tok")
    path = write_jsonl(tmp_path / "c.jsonl", [sharegpt_row(OPENAI[0])])
    data = DataConfig(source="file", path=path, format="chat", val_fraction=0.0, max_seq_len=256)
    without = build_tokenizer(TokenizerConfig(path=str(tmp_path / "tok")), ModelConfig())
    with pytest.raises(RecipeError, match="tokenizer.chat_template"):
        build_data(data, without, seed=0)
    chatml = build_tokenizer(TokenizerConfig(path=str(tmp_path / "tok"), chat_template="chatml"), ModelConfig())
    assert chatml.chat_template == CHATML
    (sample,) = build_data(data, chatml, seed=0).train
    learned = chatml.decode([t for t in sample["labels"] if t != -100])
    assert learned == "4<|im_end|></s>"  # the assistant's answer, the end of its turn and eos, nothing else
    jinja = tmp_path / "mine.jinja"
    jinja.write_text("{% for m in messages %}{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}")
    own = build_tokenizer(TokenizerConfig(path=str(tmp_path / "tok"), chat_template=str(jinja)), ModelConfig())
    assert own.chat_template == jinja.read_text()
    saved = tmp_path / "saved"
    chatml.save_pretrained(saved)  # checkpoints and final/ carry the template to generation
    assert build_tokenizer(TokenizerConfig(path=str(saved)), ModelConfig()).chat_template == CHATML


def test_an_unknown_chat_template_is_a_recipe_error(tmp_path):
    problems = _problems(tmp_path, "", tokenizer='kind = "byte"\nchat_template = "chatlm"')
    assert (
        "neither a named template (chatml, plain) nor a Jinja file"
        in problems[("tokenizer.chat_template", "error")].message
    )


def test_exact_match_on_validation_rows_from_a_file(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"{a}+1=", "completion": str(a + 1)} for a in range(8)])
    val = write_jsonl(
        tmp_path / "val.jsonl", [{"prompt": "2+1=", "completion": "3"}, {"prompt": "9+1=", "completion": "10"}]
    )
    config = DataConfig(source="file", path=train, val_path=val, val_exact_match=True)
    task = build_data(config, byte_tokenizer(), seed=0).task
    assert task.prompts == ("2+1=", "9+1=") and task.answers == ("3", "10") and task.max_new_tokens == 3
    assert build_data(DataConfig(source="file", path=train, val_path=val), byte_tokenizer(), seed=0).task is None
    out = tmp_path / "run"
    args = ["--data.source", "file", "--data.path", train, "--data.val_path", val, "--data.val_exact_match", "true"]
    args += ["--train.steps", "2", "--train.global_batch_size", "4", "--train.micro_batch_size", "4"]
    args += ["--train.eval_every", "2", "--scheduler.warmup_steps", "1", "--logging.progress", "false"]
    assert main(["run", "tiny_sft", *args, "--run.output_dir", str(out)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    scores = [r["val_exact_match"] for r in records if "val_exact_match" in r]
    assert scores and all(0.0 <= score <= 1.0 for score in scores)


def test_a_null_content_or_an_unknown_role_is_a_bad_row_named_by_file_and_line(tmp_path):
    null_reply = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": None}]}
    wizard = {"messages": [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "abracadabra"}]}
    gpt_null = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": None}]}
    rows = [openai_row(OPENAI[0]), null_reply, openai_row(OPENAI[1]), wizard, gpt_null, openai_row(OPENAI[2])]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    with pytest.raises(RecipeError) as caught:
        samples(path)
    message = str(caught.value)
    assert f"{path}:2" in message and "'messages' message 1 (assistant) has 'content' null, not text" in message
    assert f"{path}:4" in message and "'messages' message 1 has the role 'wizard'" in message
    assert "user, assistant, system or (after an assistant turn) tool" in message and "data.chat_keys" in message
    assert f"{path}:5" in message and "'conversations' message 1 (assistant) has 'value' null" in message
    assert len(samples(path, on_bad_rows="skip")) == 3  # the good rows only


def _with_template(tmp_path, text: str):
    from ditty.config.sections import ModelConfig, TokenizerConfig
    from ditty.data.tokenizer import build_tokenizer

    byte_tokenizer().save_pretrained(tmp_path / "tok")
    jinja = tmp_path / "template.jinja"
    jinja.write_text(text)
    return build_tokenizer(TokenizerConfig(path=str(tmp_path / "tok"), chat_template=str(jinja)), ModelConfig())


def test_a_chat_template_that_raises_on_every_conversation_is_blamed_not_the_data(tmp_path):
    broken = "{% for m in messages %}{{ m['role'] | no_such_filter }}{% endfor %}"
    tokenizer = _with_template(tmp_path, broken)
    path = write_jsonl(tmp_path / "c.jsonl", [openai_row(t) for t in OPENAI])
    data = DataConfig(source="file", path=path, format="chat", val_fraction=0.0, max_seq_len=64)
    with pytest.raises(RecipeError) as caught:
        build_data(data, tokenizer, seed=0)
    (problem,) = caught.value.problems
    assert problem.key == "tokenizer.chat_template", problem
    assert "the chat template fails on any conversation" in problem.message and "no_such_filter" in problem.message
    assert "each sample must be" not in str(caught.value)


def test_a_chat_template_s_own_rule_is_named_as_the_template_s(tmp_path):
    alternate = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{{ m['role'] }}: {% generation %}{{ m['content'] }}{% endgeneration %}\n{% endfor %}"
    )
    tokenizer = _with_template(tmp_path, alternate)
    path = write_jsonl(tmp_path / "c.jsonl", [openai_row(t) for t in OPENAI])  # row 1 starts with a system turn
    data = DataConfig(source="file", path=path, format="chat", val_fraction=0.0, max_seq_len=64)
    with pytest.raises(RecipeError) as caught:
        build_data(data, tokenizer, seed=0)
    (problem,) = caught.value.problems
    assert problem.key == "tokenizer.chat_template", problem
    assert "the chat template refused a conversation" in problem.message
    assert "Conversation roles must alternate" in problem.message and "'be brief'" in problem.message
    assert "follow the template's rule" in problem.fix


def test_a_tool_message_is_read_after_an_assistant_turn_and_refused_anywhere_else(tmp_path):
    call = [("user", "2*3="), ("assistant", "call"), ("tool", "six"), ("assistant", "6")]
    loose = [("user", "hi"), ("tool", "6"), ("assistant", "6")]
    path = write_jsonl(tmp_path / "chat.jsonl", [openai_row(call), openai_row(loose)])
    with pytest.raises(RecipeError) as caught:
        samples(path)
    message = str(caught.value)
    assert f"{path}:2" in message and "message 1 has the role 'tool' but follows no assistant turn" in message
    assert f"{path}:1" not in message
    ((ids, labels),) = samples(path, on_bad_rows="skip")
    trained = byte_tokenizer().decode([i for i, label in zip(ids, labels) if label != -100], skip_special_tokens=True)
    assert "call" in trained and "6" in trained and "six" not in trained  # the assistant's turns train, not the tool's
