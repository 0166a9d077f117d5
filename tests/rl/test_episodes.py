"""Episodes of several turns on a real tiny Llama: the tokens an episode trains on are those of its
conversation rendered whole (as the chat format renders the SFT demonstrations), the environment's
tokens take no loss and no gradient, episodes that end drop out of the next turn, and an episode
past its budget is cut and counted, never an error."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.sections import ModelConfig, TokenizerConfig
from ditty.data.builtin import tool_demonstration
from ditty.data.chat_layouts import ChatLayout
from ditty.data.formats.lm import encode_chat
from ditty.data.tokenizer import build_tokenizer
from ditty.objectives.environments.episodes import EpisodeEnvironment
from ditty.objectives.environments.rendering import ObservationRenderer
from ditty.objectives.environments.tools.builtin_tools import calculator
from ditty.objectives.environments.tools.tool_environment import ToolEnvironment
from ditty.objectives.rewards.functions import load_reward_functions
from ditty.objectives.rl.assembler import Assembler
from ditty.objectives.rl.grpo import grpo_loss
from ditty.objectives.sampling.generate_sampler import GenerateSampler, TurnRequest
from tests.rl.environments_for_tests import CountingTurns
from tests.rl.helpers import TINY_LLAMA


def rl_settings(**changes):
    settings = dict(
        group_size=2,
        max_new_tokens=6,
        temperature=1.0,
        top_p=1.0,
        generation_batch_size=0,
        max_turns=3,
        max_episode_tokens=64,
        mask_truncated=False,
        updates_per_rollout=1,
        beta=0.0,
        reward_timeout_s=600.0,
    )
    return types.SimpleNamespace(**{**settings, **changes})


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tokenizer(TokenizerConfig(kind="byte"), ModelConfig(init="random", architecture="llama"))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_LLAMA, "max_position_embeddings": 256},
    )
    model = LlamaForCausalLM(config)
    # A head that favours the end-of-sequence token (p about 0.36 a token): turns end, and episodes
    # have several of them, within a few tokens.
    biased = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True)
    with torch.no_grad():
        biased.weight.copy_(model.lm_head.weight)
        biased.bias.zero_()
        biased.bias[tokenizer.eos_token_id] = 5.0
    ends_turns = LlamaForCausalLM(config)
    ends_turns.load_state_dict(model.state_dict())
    ends_turns.lm_head = biased
    return types.SimpleNamespace(tokenizer=tokenizer, model=model, ends_turns=ends_turns)


def prompts(rows):
    return {"prompts": [r["prompt"] for r in rows], "columns": {"completion": [r["completion"] for r in rows]}}


def test_an_episode_is_its_conversation_rendered_whole(tiny):
    """The tool demonstration the SFT stage trains on, played as an episode (the model's turns given
    as token ids): the same tokens, and the trainable ones are exactly the SFT's supervised ones."""
    tok = tiny.tokenizer
    messages = tool_demonstration("123*456=", "56088")
    renderer = ObservationRenderer(tok, 64)
    env = ToolEnvironment({"calculator": calculator})
    ids, conversation = renderer.prompt(env.reset({"prompt": "123*456="}))
    tokens, trainable = list(ids), [False] * len(ids)
    for turn in (messages[1]["content"], messages[3]["content"]):
        written = tok(turn, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        tokens, trainable = tokens + written, trainable + [True] * len(written)
        result = env.step(turn)
        if result.done:
            break
        added, conversation = renderer.after_turn(conversation, turn, result.observation)
        tokens, trainable = tokens + added, trainable + [False] * len(added)
    sft = encode_chat({"messages": [messages]}, tokenizer=tok, layout=ChatLayout(), max_len=512)
    sft_ids, sft_labels = sft["input_ids"][0], sft["labels"][0]
    assert (
        sft_ids[: len(tokens)] == tokens and tok.decode(sft_ids[len(tokens) :]) == "\n"
    )  # the template's last newline
    assert [label != IGNORE_INDEX for label in sft_labels[: len(tokens)]] == trainable


def test_episodes_play_their_turns_and_drop_out_when_done(tiny):
    rl = rl_settings(max_turns=4)
    sampler = GenerateSampler(lambda: tiny.ends_turns, rl, rl.group_size, tiny.tokenizer, torch.device("cpu"), seed=0)
    renderer = ObservationRenderer(tiny.tokenizer, 32)
    environment = EpisodeEnvironment(CountingTurns, "CountingTurns", [], renderer, rl, rl, reward_name="CountingTurns")
    rows = [{"prompt": "1+2=", "completion": "3"}, {"prompt": "40+2=", "completion": "42"}]
    seen = []
    original = sampler.generate_turn
    sampler.generate_turn = lambda turn: seen.append(len(turn.histories)) or original(turn)
    out = environment.run(sampler, prompts(rows), 0, rl.group_size)
    assert len(out) == 4 and out.prompt_ids[0] == out.prompt_ids[1] != out.prompt_ids[2]
    turns = out.episode_metrics["env/turns"].tolist()
    finished = [not t for t in out.truncated]
    assert sum(finished) >= 1 and all(t == 3 for t, f in zip(turns, finished) if f)  # CountingTurns ends after 3
    assert len(seen) == 3 and seen[0] == 4 and seen[-1] < 4  # finished (or cut) episodes leave the batch
    assert seen == sorted(seen, reverse=True)
    for row in range(4):
        spans, trainable = out.turn_spans[row], out.trainable[row]
        assert [i for s, e in spans for i in range(s, e)] == [i for i, t in enumerate(trainable) if t]
        assert len(out.turn_rewards[row]) == len(spans)
        assert float(out.rewards[row]) == pytest.approx(sum(out.turn_rewards[row]))
    assert out.rewards_per_function["CountingTurns"].tolist() == out.rewards.tolist()
    assert out.episode_metrics["env/answers"].tolist() == turns


def test_an_episode_past_its_budget_is_cut_and_counted(tiny):
    rl = rl_settings(max_new_tokens=8, max_episode_tokens=5)
    sampler = GenerateSampler(lambda: tiny.model, rl, rl.group_size, tiny.tokenizer, torch.device("cpu"), seed=0)
    functions = load_reward_functions(["ditty.objectives.rewards.builtin_rewards:exact_match"])
    env = EpisodeEnvironment(
        lambda: ToolEnvironment({"calculator": calculator}),
        "ToolEnvironment",
        functions,
        ObservationRenderer(tiny.tokenizer, 32),
        rl,
        rl,
    )
    out = env.run(sampler, prompts([{"prompt": "3*4=", "completion": "12"}]), 0, 2)
    assert all(len(ids) <= 5 for ids in out.completion_ids) and all(out.truncated)
    assert out.episode_metrics["env/truncated"].tolist() == [1.0, 1.0]


def test_the_prompt_cache_samples_what_whole_contexts_sample(tiny):
    """A later turn's rows [prompt | pad | history] from the prompts' cache give the tokens that
    `generate` gives on each whole context alone (greedy)."""
    tok, rl = tiny.tokenizer, rl_settings(max_new_tokens=5)
    sampler = GenerateSampler(lambda: tiny.model, rl, rl.group_size, tok, torch.device("cpu"), seed=0)
    prompt_ids = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    histories = [
        tok("ab", add_special_tokens=False)["input_ids"],
        [],
        tok("xyz12", add_special_tokens=False)["input_ids"],
    ]
    request = TurnRequest(prompt_ids, [0, 0, 1], histories, 5, seed_position=0, turn=1, greedy=True)
    batched = sampler.generate_turn(request).tokens
    for prompt, history, got in zip([0, 0, 1], histories, batched):
        alone = sampler.generate_turn(TurnRequest([prompt_ids[prompt] + history], [0], [[]], 5, 0, 1, greedy=True))
        assert got == alone.tokens[0]


def test_the_environments_tokens_take_no_loss_and_no_gradient(tiny):
    """Perturbing the logits at the positions that predict the environment's tokens changes neither
    the policy loss nor its gradient; perturbing those that predict the model's own tokens does."""
    from ditty.objectives.rl.loss import GRPOLoss
    from ditty.stages.fused_loss import HEAD_INPUT

    rl = rl_settings(max_turns=3, loss="dapo", clip_low=0.2, clip_high=None, importance="token", max_new_tokens=6)
    sampler = GenerateSampler(lambda: tiny.ends_turns, rl, rl.group_size, tiny.tokenizer, torch.device("cpu"), seed=0)
    env = EpisodeEnvironment(CountingTurns, "CountingTurns", [], ObservationRenderer(tiny.tokenizer, 32), rl, rl)
    rollouts = env.run(sampler, prompts([{"prompt": "12+30=", "completion": "42"}]), 0, 2)
    rollouts.advantages = torch.tensor([1.0, -0.5])
    (batch,) = Assembler(rl, rl, pad_token_id=tiny.tokenizer.pad_token_id, micro_batch_size=8)(rollouts)
    assert any(not t for row in rollouts.trainable for t in row)  # the episodes hold environment tokens
    labels = batch["labels"]
    environment = torch.zeros_like(labels, dtype=torch.bool)
    for row, (prompt, trainable) in enumerate(zip(rollouts.prompt_ids, rollouts.trainable)):
        for i, mine in enumerate(trainable):
            environment[row, len(prompt) + i] = not mine
    # the head input at position p predicts the token at p + 1
    predicts_environment = torch.zeros_like(environment)
    predicts_environment[:, :-1] = environment[:, 1:]
    predicts_model = torch.zeros_like(environment)
    predicts_model[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    loss_stage = GRPOLoss(rl, rl, chunks=1)
    units = {k: v.clone() for k, v in loss_stage.count_units(batch).items()}

    def loss_and_grads(perturbed):
        model = tiny.model
        model.zero_grad()
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        noise = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1)) * 5
        hidden = hidden + noise * perturbed[..., None]
        out = loss_stage.compute(None, {"batch": batch, "model": model, HEAD_INPUT: hidden, "global_units": units})
        out.loss.backward()
        return out.loss.detach(), [p.grad.clone() for p in model.parameters()]

    base_loss, base_grads = loss_and_grads(torch.zeros_like(environment))
    loss, grads = loss_and_grads(predicts_environment)
    assert predicts_environment.any()
    assert loss == base_loss and all(torch.equal(a, b) for a, b in zip(grads, base_grads))
    _, moved = loss_and_grads(predicts_model)  # (on-policy, the loss's value is -mean advantage either way)
    assert not all(torch.equal(a, b) for a, b in zip(moved, base_grads))


def test_per_turn_credit_sums_the_normalised_rewards_of_a_turn_and_the_later_ones():
    """DeepSeekMath's process supervision (section 4.1.3): the rewards of all turns of a group
    normalised together, a turn's tokens taking the sum over that turn and the later ones."""
    from ditty.objectives.rl.turn_credit import turn_advantages

    rewards = [[1.0, 0.0], [0.0], [0.5, 0.5, 1.0], [2.0]]  # two groups of two episodes
    spans = [[(0, 2), (4, 5)], [(0, 3)], [(0, 1), (2, 3), (5, 6)], [(0, 1)]]
    got = turn_advantages(rewards, spans, [5, 3, 6, 1], group_size=2, scale_rewards="group")
    first = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    norm = (first - first.mean()) / (first.std() + 1e-4)
    assert got[0, :2].tolist() == pytest.approx([float(norm[0] + norm[1])] * 2)
    assert got[0, 2:4].tolist() == [0.0, 0.0]  # the environment's tokens between the turns
    assert got[0, 4].item() == pytest.approx(float(norm[1])) and got[1, :3].tolist() == pytest.approx(
        [float(norm[2])] * 3
    )
    second = torch.tensor([0.5, 0.5, 1.0, 2.0], dtype=torch.float64)
    norm = (second - second.mean()) / (second.std() + 1e-4)
    assert got[2, 0].item() == pytest.approx(float(norm[:3].sum())) and got[2, 5].item() == pytest.approx(
        float(norm[2])
    )
    assert got[3, 0].item() == pytest.approx(float(norm[3]))
    unscaled = turn_advantages(rewards, spans, [5, 3, 6, 1], group_size=2, scale_rewards="none")
    assert unscaled[0, 0].item() == pytest.approx((1 - 1 / 3) + (0 - 1 / 3))


def test_per_turn_advantages_reach_the_loss_aligned_with_their_tokens(tiny):
    from ditty.objectives.rl.turn_credit import turn_advantages

    rl = rl_settings(max_turns=3)
    sampler = GenerateSampler(lambda: tiny.ends_turns, rl, rl.group_size, tiny.tokenizer, torch.device("cpu"), seed=0)
    env = EpisodeEnvironment(CountingTurns, "CountingTurns", [], ObservationRenderer(tiny.tokenizer, 32), rl, rl)
    out = env.run(sampler, prompts([{"prompt": "12+30=", "completion": "42"}]), 0, 2)
    widths = [len(ids) for ids in out.completion_ids]
    out.advantages = turn_advantages(out.turn_rewards, out.turn_spans, widths, 2, "group")
    (batch,) = Assembler(rl, rl, pad_token_id=tiny.tokenizer.pad_token_id, micro_batch_size=8)(out, drop_idle=False)
    assert batch["advantages"].shape == batch["labels"].shape
    for row in range(2):
        scored = batch["labels"][row] != IGNORE_INDEX
        expected = out.advantages[row, : widths[row]][torch.tensor(out.trainable[row])]
        assert batch["advantages"][row][scored].tolist() == pytest.approx(expected.tolist())
        assert (batch["advantages"][row][~scored] == 0).all()
    # Through the loss, as the trainer runs it (log-probabilities aligned with the labels): on-policy
    # (ratio 1), dapo, the gradient of a scored token's log-probability is -its advantage / tokens.
    logps = torch.zeros(batch["labels"].shape, requires_grad=True)
    mask = batch["labels"] != IGNORE_INDEX
    out = grpo_loss(logps, None, batch["advantages"], mask, global_sequences=2, global_tokens=mask.sum())
    out.loss.backward()
    expected = torch.where(mask, -batch["advantages"] / mask.sum(), torch.zeros(()))
    assert torch.allclose(logps.grad, expected)


class AnswersAtLength:
    """Answers the model's first turn with an observation of 10 MB (as messages, or as text)."""

    as_text = False

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, completion):
        from ditty.objectives.environments.protocol import StepResult

        huge = "7" * 10_000_000
        return StepResult(observation=huge if self.as_text else [{"role": "user", "content": huge}])


class AnswersAtLengthAsText(AnswersAtLength):
    as_text = True


@pytest.mark.parametrize("environment", [AnswersAtLength, AnswersAtLengthAsText])
def test_a_huge_observation_is_cut_to_the_episodes_room_before_it_is_rendered(tiny, environment):
    import time

    rl = rl_settings(max_new_tokens=8, max_episode_tokens=48, max_turns=3, environment_timeout_s=0.0)
    sampler = GenerateSampler(lambda: tiny.ends_turns, rl, rl.group_size, tiny.tokenizer, torch.device("cpu"), seed=0)
    renderer = ObservationRenderer(tiny.tokenizer, 32)
    rendered, tokenized = [], []
    render, tokenize = renderer.render, renderer.encode
    renderer.render = lambda messages, generation_prompt: (
        rendered.append(sum(len(m["content"]) for m in messages)) or render(messages, generation_prompt)
    )
    renderer.encode = lambda text: tokenized.append(len(text)) or tokenize(text)
    env = EpisodeEnvironment(environment, "Huge", [], renderer, rl, rl)
    started = time.monotonic()
    out = env.run(sampler, prompts([{"prompt": "1+2=", "completion": "3"}]), 0, 2)
    assert time.monotonic() - started < 10
    assert max(rendered + tokenized) <= 48 * renderer.chars_per_token + 100  # never the 10 MB
    cut = out.episode_metrics["env/observations_cut"].tolist()
    assert sum(cut) >= 1 and all(c in (0.0, 1.0) for c in cut), cut
    for ids, trainable, was_cut in zip(out.completion_ids, out.trainable, cut):
        assert len(ids) <= 48
        if was_cut:  # the model's turn, then the observation's first tokens up to the room: cut there
            assert len(ids) == 48 and not trainable[-1]
            assert tiny.tokenizer.decode(ids[-10:]).endswith("7" * 5)


class LongPrompt:
    """reset returns a prompt of `length` characters."""

    length = 100

    def reset(self, row):
        return "9" * self.length

    def step(self, completion):
        from ditty.objectives.environments.protocol import StepResult

        return StepResult(done=True)


class HugePrompt(LongPrompt):
    length = 10_000_000


@pytest.mark.parametrize("environment, words", [(LongPrompt, "101 tokens"), (HugePrompt, "10,000,000 characters")])
def test_a_reset_longer_than_max_seq_len_is_refused_not_cut(tiny, environment, words):
    """rl.md: a prompt longer than data.max_seq_len is a bad row, not cut (without its start it loses
    its question, without its end the generation prompt)."""
    import re

    from ditty.objectives.environments.protocol import EnvironmentFailure

    rl = rl_settings(environment_timeout_s=0.0)
    env = EpisodeEnvironment(environment, "Long", [], ObservationRenderer(tiny.tokenizer, 32), rl, rl)
    with pytest.raises(EnvironmentFailure, match=re.escape(f"reset returned a prompt of {words}")) as failed:
        env.open({"prompt": "1+2=", "completion": "3"})
    assert "data.max_seq_len = 32" in str(failed.value) and "raise data.max_seq_len" in str(failed.value)
