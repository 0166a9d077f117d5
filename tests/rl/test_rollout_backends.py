"""The rollout backends' parts that need no vLLM: the LoRA weights a vLLM engine is sent, a rollout
server that is dead or too old (exit 2 naming rollout.vllm_server and the fix, in bounded time), and a
checkpoint written before the backend keys existed (it resumes)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ditty.checkpoint.resume_diff import flatten_recipe, recipe_differences
from ditty.config import RecipeError, TrainerConfig


def test_lora_weights_are_sent_merged_under_the_base_models_names(tiny_llama_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ditty.objectives.sampling.policy_weights import policy_weights

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    names = {name for name, _ in model.named_parameters()}
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a trained adapter (lora_B starts at 0)
    sent = dict(policy_weights(peft))
    live = {n: p.detach().clone() for n, p in peft.named_parameters()}
    merged = peft.merge_and_unload()
    assert set(sent) == names
    for name, tensor in merged.named_parameters():
        assert torch.allclose(sent[name], tensor, atol=1e-6), name
    assert not torch.equal(
        sent["model.layers.0.self_attn.q_proj.weight"],
        live["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"],
    )  # the delta is in


def test_which_adapters_the_engine_is_sent_alone(tiny_llama_dir):
    """adapter_sync.adapter_plan: a LoRA adapter on the blocks' linear layers goes alone (vLLM serves it,
    at the smallest engine rank at or above its own); DoRA, an adapter on the output head and
    modules_to_save go merged. The base weights sent once are the base model's, not merged."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ditty.objectives.sampling.adapter_sync import adapter_plan, adapter_weights, base_weights

    def adapted(**config):
        model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
        settings = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], **config}
        return get_peft_model(model, LoraConfig(**settings))

    lora = adapted()
    plan = adapter_plan(lora)
    assert plan is not None and (plan.rank, plan.engine_rank) == (4, 8)
    assert plan.config["r"] == 4 and sorted(plan.config["target_modules"]) == ["q_proj", "v_proj"]
    assert adapter_plan(lora.get_base_model()) is None  # no adapter: the weights as they are
    assert adapter_plan(adapted(use_dora=True)) is None
    assert adapter_plan(adapted(target_modules=["q_proj", "lm_head"])) is None
    assert adapter_plan(adapted(modules_to_save=["lm_head"])) is None
    assert adapter_plan(adapted(r=600)) is None  # above vLLM's largest max_lora_rank

    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_()
    names = {name for name, _ in AutoModelForCausalLM.from_pretrained(tiny_llama_dir).named_parameters()}
    base = dict(base_weights(lora))
    assert set(base) == names
    assert torch.equal(
        base["model.layers.0.self_attn.q_proj.weight"],
        lora.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight,
    )  # not merged: the engine adds the adapter itself
    adapter = dict(adapter_weights(lora))
    assert len(adapter) == 2 * 2 * 2  # A and B of q_proj and v_proj in each of 2 layers
    assert all(".lora_A." in n or ".lora_B." in n for n in adapter)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in adapter  # as PEFT saves it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_rollout(url: str, **changes):
    from ditty.config.rollout import RolloutConfig

    return RolloutConfig(backend="vllm-server", vllm_server=url, **changes)


def test_a_dead_server_is_exit_2_after_the_bounded_retries():
    from ditty.objectives.sampling.vllm_server import ServerSampler

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.perf_counter()
    with pytest.raises(RecipeError) as caught:
        ServerSampler(lambda: None, server_rollout(url, vllm_retries=2, vllm_timeout_s=2), 8, None, seed=0, run_dir="")
    assert time.perf_counter() - started < 10  # 2 tries, 2 s apart
    text = caught.value.format()
    assert "`rollout.vllm_server`" in text and "after 2 tries" in text and "ditty rollout-server" in text
    assert "resumes" in text


class OldServer(http.server.BaseHTTPRequestHandler):
    """A server that answers like an old vLLM (only /version): the version check must refuse it."""

    def do_GET(self):  # noqa: N802
        body = json.dumps({"version": "0.10.1"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_of_an_older_vllm_is_refused_at_the_first_contact():
    from ditty.objectives.sampling.vllm_server import ServerSampler

    server = http.server.HTTPServer(("127.0.0.1", 0), OldServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(RecipeError) as caught:
            ServerSampler(lambda: None, server_rollout(url), 8, SimpleNamespace(eos_token_id=2), seed=0, run_dir="")
    finally:
        server.shutdown()
    text = caught.value.format()
    assert "runs vLLM 0.10.1" in text and ">= 0.32" in text and "upgrade vllm" in text


def test_a_checkpoint_from_before_the_backend_keys_resumes():
    current = flatten_recipe(TrainerConfig())
    rollout_keys = [k for k in current if k.startswith("rollout.")]
    saved = {k: v for k, v in current.items() if k not in rollout_keys}
    saved["rl.backend"] = "transformers"  # the old name (and old key) of the default
    saved["rl.max_new_tokens"] = current["rollout.max_new_tokens"]  # a checkpoint from before [rollout]
    assert recipe_differences(saved, current, step=3) == []
    diffs = recipe_differences(saved, {**current, "rollout.max_staleness": 1}, step=3)  # not the default: it counts
    assert len(diffs) == 1 and diffs[0].startswith('rollout.max_staleness: "<absent>" -> 1'), diffs
    moved = recipe_differences(saved, {**current, "rollout.max_new_tokens": 9}, step=3)  # saved as rl.max_new_tokens
    assert len(moved) == 1 and moved[0].startswith("rollout.max_new_tokens: 512 -> 9"), moved


class FakeVLLMServer(http.server.BaseHTTPRequestHandler):
    """Answers as a vLLM 0.32 server of ditty's rollout-server would: completions of 3 fixed tokens with
    their log-probabilities, and weight reloads from a path (each one's directory recorded)."""

    reloads: list = []

    def answer(self, value) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self.path.startswith("/version"):
            self.answer({"version": "0.32.0"})
        elif self.path.startswith("/server_info"):
            self.answer({"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}})
        else:
            self.answer({"data": [{"id": "ditty-policy", "max_model_len": 64}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/collective_rpc":
            path = body["kwargs"]["weights_path"]
            index = json.loads((Path(path) / "model.safetensors.index.json").read_text())
            assert all((Path(path) / shard).exists() for shard in set(index["weight_map"].values()))
            self.reloads.append(path)
            self.answer({})
        else:
            self.answer(
                {
                    "choices": [
                        {"index": i, "token_ids": [60, 61, 62], "logprobs": {"token_logprobs": [-1.0, -1.0, -1.0]}}
                        for i in range(body["n"])
                    ]
                }
            )

    def log_message(self, *args):
        pass


def test_a_run_on_a_rollout_server_sends_weights_from_its_own_run_directory(tmp_path, tiny_llama_dir, monkeypatch):
    from tests.rl.vllm_runs import records, write_recipe
    from tests.train.test_resume import ditty

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLMServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeVLLMServer.reloads = []
    monkeypatch.chdir(tmp_path)  # a stray rollout_weights/ would land here
    try:
        recipe = write_recipe(tmp_path / "a", tiny_llama_dir, steps=2)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        done = ditty("run", str(recipe), "--rollout.backend", "vllm-server", "--rollout.vllm_server", url)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "a" / "run"
    assert [r["step"] for r in records(run)] == [1, 2]
    assert [Path(p).name for p in FakeVLLMServer.reloads] == ["v0", "v1"]  # the policy before each step
    assert all(Path(p).parent == (run / "rollout_weights").resolve() for p in FakeVLLMServer.reloads)
    assert not (run / "rollout_weights").exists()  # removed at the end of the run
    assert not (tmp_path / "rollout_weights").exists()


def test_the_rollout_server_of_a_recipe_imports_its_reward_module_from_the_current_directory(
    tmp_path, tiny_llama_dir, monkeypatch, capsys
):
    """`ditty rollout-server RECIPE --print-command` in the directory of the user's reward module, as
    `ditty run` and `ditty check` take it (the server path failed for any reward of one's own), and
    `--trust-run-code` there is named for what it is, not "flag --trust_run_code has no value"."""
    from ditty.cli import main
    from tests.rl.vllm_runs import write_recipe

    module = f"my_rewards_{int(time.time() * 1e6)}"  # fresh for sys.modules
    (tmp_path / f"{module}.py").write_text(
        "def score(prompts, completions, **columns):\n    return [float(len(c)) for c in completions]\n"
    )
    recipe = write_recipe(tmp_path / "a", tiny_llama_dir, steps=2)
    recipe.write_text(recipe.read_text().replace("tests.rl.rewards_for_tests:text_hash_reward", f"{module}:score"))
    monkeypatch.chdir(tmp_path)
    flags = ["--rollout.backend", "vllm-server"]
    code = main(["rollout-server", str(recipe), *flags, "--print-command"])  # the module's first import
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "vllm.entrypoints.openai.api_server" in printed.out and f"--model {tiny_llama_dir}" in printed.out
    code = main(["rollout-server", str(recipe), *flags, "--print-command", "--trust-run-code"])
    said = capsys.readouterr().err
    assert code == 2 and "has no value" not in said and "--trust-run-code" in said and "as `ditty run` does" in said


def test_weights_for_a_server_are_written_bucket_by_bucket_with_their_index(tmp_path, tiny_llama_dir):
    """rollout.sync_bucket_mb cuts the policy's weights into shards of about that size, each written
    before the next is gathered; the shards and their index hold every parameter, bitwise."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ditty.objectives.sampling.policy_weights import policy_weights, stream_policy_weights, weight_buckets
    from ditty.objectives.sampling.vllm_server import write_shards

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    sizes = [[t.numel() * t.element_size() for _, t in b] for b in weight_buckets(stream_policy_weights(model), 2**14)]
    assert len(sizes) > 2 and all(sum(b[:-1]) < 2**14 for b in sizes)  # a bucket closes once it reaches the size
    write_shards(weight_buckets(stream_policy_weights(model, cpu=True), 2**14), str(tmp_path))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == len(sizes) and sorted(p.name for p in tmp_path.glob("*.safetensors")) == shards
    written = {}
    for shard in shards:
        written.update(load_file(str(tmp_path / shard)))
    expected = dict(policy_weights(model))
    assert written.keys() == expected.keys() == index["weight_map"].keys()
    assert all(torch.equal(written[k], expected[k]) for k in expected)
