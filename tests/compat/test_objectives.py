"""The Python API's post-training objectives: `Pipeline(preference=...)` trains the DPO family on
preference rows with the losses of the same recipe run from the command line, and
`Pipeline(reward_fn=...)` runs GRPO with the original library's reward_fn(task, completion_text),
whichever of its return shapes (a float, a (reward, metrics) pair, a dict), and `Pipeline(distill=...)`
distils a teacher with the losses of the same recipe run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ditty.cli import main
from ditty.compat.pipeline import ModelFactory, Pipeline
from ditty.config.errors import RecipeError
from ditty.config.preference import PreferenceConfig
from ditty.config.rl import RLConfig
from ditty.config.rollout import RolloutConfig
from ditty.loss import CrossEntropyLoss
from tests.preference.recipes import preference_recipe, write_pairs
from tests.preference.test_loss import BETA, PAIRS, reference_dir  # noqa: F401 (a fixture)


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row and "step" in row]


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "loss" in row]


SHARED = dict(lr=1e-3, steps=2, batch_size=8, log_every=1, device="cpu", seed=0, progress=False)
# The same in a recipe: the Pipeline's lr=, and its constant schedule.
SHARED_TOML = '[optimizer]\nlr = 1e-3\n[scheduler]\nkind = "constant"\n'


def dpo_toml(*lines: str) -> str:
    """SHARED_TOML and a DPO [preference] section at BETA, then `lines`."""
    return SHARED_TOML + "\n".join(["[preference]", 'kind = "dpo"', f"beta = {BETA}", *lines]) + "\n"


def test_a_preference_pipeline_trains_dpo_with_the_losses_of_the_cli(tmp_path, tiny_llama_dir, reference_dir):
    pipeline = Pipeline(
        model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
        dataset=PAIRS,
        preference=PreferenceConfig(kind="dpo", beta=BETA, reference=reference_dir),
        output_dir=str(tmp_path / "api"),
        extra_config={"data": {"max_seq_len": 32, "val_fraction": 0}},
        **SHARED,
    )
    assert pipeline.config().data.format == "preference"
    pipeline.run()
    api = _losses(tmp_path / "api")

    data = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    extra = dpo_toml(f'reference = "{reference_dir}"')
    recipe = preference_recipe(tmp_path, tiny_llama_dir, data, extra=extra, batch=(8, 8), run="cli")
    assert main(["run", str(recipe)]) == 0
    cli = _losses(tmp_path / "cli")
    assert len(api) == len(cli) == 2
    assert api[1] < api[0]  # it learns
    assert api == pytest.approx(cli, abs=1e-6)
    assert "rewards/accuracies" in _metrics(tmp_path / "api")[0]


def test_a_preference_pipeline_refuses_a_second_objective(tiny_llama_dir):
    with pytest.raises(RecipeError, match="two objectives"):
        Pipeline(
            model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
            dataset=PAIRS,
            preference={"kind": "dpo"},
            reward_fn=lambda task, text: 0.0,
        )
    with pytest.raises(RecipeError, match="no field"):
        Pipeline(model_factory=ModelFactory.from_huggingface(tiny_llama_dir), dataset=PAIRS, preference={"kynd": "x"})
    # GRPO's policy loss would replace a loss calculator given beside reward_fn= without a word
    with pytest.raises(RecipeError, match="would replace loss_calculator=CrossEntropyLoss"):
        Pipeline(
            model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
            dataset=PROMPTS,
            loss_calculator=CrossEntropyLoss(),
            reward_fn=lambda task, text: 0.0,
        )


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def _shape(kind: str, reward: float, length: int):
    if kind == "float":
        return reward
    if kind == "pair":
        return reward, {"length": length}
    return {"reward": reward, "metrics": {"length": length}}


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"reward_timeout_s": -1.0}, "`rl.reward_timeout_s`"),
        ({"reward_timeout_s": float("nan")}, "`rl.reward_timeout_s` is nan"),
        ({"reward_weights": [1.0, 2.0]}, "`rl.reward_weights` has 2 weights for 1 reward functions"),
    ],
)
def test_rl_reward_settings_beside_reward_fn_are_checked_at_construction(tiny_llama_dir, settings, words):
    """reward_fn= stands in for rl.rewards only: the other rl.reward_* settings are checked as a
    recipe's are, and the weights against the functions given."""
    with pytest.raises(RecipeError, match=re.escape(words)):
        Pipeline(
            model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
            dataset=PROMPTS,
            reward_fn=lambda prompts, completions, **columns: [0.0] * len(completions),
            rl=RLConfig(group_size=4, **settings),
            rollout=RolloutConfig(max_new_tokens=4),
        )


@pytest.mark.parametrize("kind", ["float", "pair", "dict"])
def test_reward_fn_of_the_original_library_runs_grpo(tmp_path, tiny_llama_dir, kind):
    calls: list[tuple[dict, str]] = []

    def reward_fn(task, completion_text):
        calls.append((task, completion_text))
        return _shape(kind, float(completion_text.strip() == task["answer"]) + 0.1 * len(completion_text), 7)

    pipeline = Pipeline(
        model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
        dataset=PROMPTS,
        reward_fn=reward_fn,
        rl=RLConfig(group_size=4),
        rollout=RolloutConfig(max_new_tokens=3, temperature=1.0),
        output_dir=str(tmp_path / "grpo"),
        extra_config={"data": {"max_seq_len": 32, "val_fraction": 0}},
        **SHARED,
    )
    assert pipeline.config().rl.kind == "grpo" and pipeline.config().data.format == "prompt"
    pipeline.run()
    steps = _metrics(tmp_path / "grpo")
    assert len(steps) == 2
    assert len(calls) == 2 * 8  # every completion of both steps, 8 a step (2 prompts x group of 4)
    assert all(set(task) == {"prompt", "answer"} for task, _ in calls)
    first = [float(text.strip() == task["answer"]) + 0.1 * len(text) for task, text in calls[:8]]
    assert steps[0]["reward"] == pytest.approx(sum(first) / 8, abs=1e-6)
    if kind != "float":  # the metrics of the pair and the dict are logged per function
        assert any(key.endswith("/length") and value == pytest.approx(7.0) for key, value in steps[0].items())


def test_a_preference_loss_with_a_reference_of_ones_own(tmp_path, tiny_llama_dir, reference_dir):
    """loss_calculator=PreferenceLoss(config, reference=fn): the reference is the caller's function (here
    the same checkpoint as the recipe's reference path, so the losses are the path's)."""
    from transformers import AutoModelForCausalLM

    from ditty import PreferenceLoss
    from ditty.objectives.reference import FrozenModel, frozen

    other = FrozenModel(frozen(AutoModelForCausalLM.from_pretrained(reference_dir)), chunks=8)
    calls = []

    def reference(batch):
        calls.append(len(batch["input_ids"]))
        return other.sequence_logps(batch)

    runs = {}
    for name, keywords in {
        "path": dict(preference=PreferenceConfig(kind="dpo", beta=BETA, reference=reference_dir)),
        "own": dict(loss_calculator=PreferenceLoss(PreferenceConfig(kind="dpo", beta=BETA), reference=reference)),
    }.items():
        Pipeline(
            model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
            dataset=PAIRS,
            output_dir=str(tmp_path / name),
            extra_config={"data": {"max_seq_len": 32, "val_fraction": 0}},
            **keywords,
            **SHARED,
        ).run()
        runs[name] = _losses(tmp_path / name)
    assert calls == [16, 16]  # each step's 8 pairs, chosen and rejected rows
    assert runs["own"] == pytest.approx(runs["path"], abs=1e-6)


ANSWERS = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(3, 9) for b in range(4)]
DISTILL = {"teacher": None, "beta": 0.5, "lmbda": 0.5, "max_new_tokens": 3, "temperature": 1.0}


def _distill_pipeline(tmp_path, student, name, dataset=ANSWERS, **keywords) -> Pipeline:
    return Pipeline(
        model_factory=ModelFactory.from_huggingface(student),
        dataset=dataset,
        output_dir=str(tmp_path / name),
        **keywords,
        **SHARED,
    )


def test_a_distill_pipeline_trains_with_the_losses_of_the_cli(tmp_path, tiny_llama_dir, reference_dir):
    """distill= (or [distill] through extra_config) on prompt/completion rows: the student's losses and
    on-policy steps are those of the same recipe run from the command line."""
    distill = {**DISTILL, "teacher": reference_dir}
    data = {"data": {"max_seq_len": 32, "val_fraction": 0}}
    pipeline = _distill_pipeline(tmp_path, tiny_llama_dir, "api", distill=distill, extra_config=data)
    assert pipeline.config().distill.kind == "gkd" and pipeline.config().data.format == "prompt_completion"
    pipeline.run()
    through_extra = {**data, "distill": {**distill, "kind": "gkd"}}
    _distill_pipeline(tmp_path, tiny_llama_dir, "extra", extra_config=through_extra).run()

    rows = tmp_path / "answers.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ANSWERS))
    recipe = tmp_path / "distill.toml"
    recipe.write_text(
        f"""
[run]
output_dir = "{tmp_path / "cli"}"
device = "cpu"
seed = 0
[model]
path = "{tiny_llama_dir}"
[data]
source = "file"
path = "{rows}"
format = "prompt_completion"
max_seq_len = 32
val_fraction = 0
[train]
steps = 2
global_batch_size = 8
micro_batch_size = 8
log_every = 1
precision = "fp32"
{SHARED_TOML}[logging]
progress = false
[distill]
kind = "gkd"
teacher = "{reference_dir}"
beta = 0.5
lmbda = 0.5
max_new_tokens = 3
temperature = 1.0
"""
    )
    assert main(["run", str(recipe)]) == 0
    runs = {name: _metrics(tmp_path / name) for name in ("api", "extra", "cli")}
    assert all(len(steps) == 2 for steps in runs.values())
    assert all(step["loss"] > 0 for step in runs["api"])  # a teacher with other weights: something to learn
    for name in ("extra", "cli"):
        for mine, theirs in zip(runs["api"], runs[name]):
            assert mine["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
            assert mine["distill/on_policy_share"] == theirs["distill/on_policy_share"]


def test_a_distill_pipeline_refuses_a_second_objective_or_a_loss(tiny_llama_dir):
    student = ModelFactory.from_huggingface(tiny_llama_dir)
    distill = {**DISTILL, "teacher": tiny_llama_dir}
    with pytest.raises(RecipeError, match="two objectives"):
        Pipeline(model_factory=student, dataset=ANSWERS, distill=distill, preference={"kind": "dpo"})
    with pytest.raises(RecipeError, match="would replace loss_calculator=CrossEntropyLoss"):
        Pipeline(model_factory=student, dataset=ANSWERS, distill=distill, loss_calculator=CrossEntropyLoss())
    with pytest.raises(RecipeError, match="no field"):
        Pipeline(model_factory=student, dataset=ANSWERS, distill={"teachr": tiny_llama_dir})


@pytest.mark.parametrize("rows", ["prompts", "pairs"])
def test_online_pairs_from_python_take_rl_and_reward_fn_with_the_losses_of_the_cli(
    tmp_path, tiny_llama_dir, capsys, rows
):
    """preference=PreferenceConfig(pairs="online") with rl= (the group size), rollout= (the sampling) and
    reward_fn= (the rewards), as [rl] and [rollout] hold them for the recipe: from prompt rows, or from
    the prompts of pairs."""
    from tests.objectives.reward_samples import with_prompts

    data = PROMPTS if rows == "prompts" else PAIRS
    pipeline = Pipeline(
        model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
        dataset=data,
        preference=PreferenceConfig(kind="dpo", beta=BETA, pairs="online"),
        rl=RLConfig(group_size=4),
        rollout=RolloutConfig(max_new_tokens=3, temperature=1.0),
        reward_fn=with_prompts,  # the completion's length: groups rarely tie
        output_dir=str(tmp_path / "api"),
        extra_config={"data": {"max_seq_len": 32, "val_fraction": 0}},
        **SHARED,
    )
    config = pipeline.config()
    assert config.data.format == ("prompt" if rows == "prompts" else "preference")
    assert config.rl.group_size == 4 and config.rl.kind == "none"
    pipeline.run()

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in data))
    extra = dpo_toml(
        'pairs = "online"',
        "[rl]",
        "group_size = 4",
        'rewards = ["tests.objectives.reward_samples:with_prompts"]',
        "[rollout]",
        "max_new_tokens = 3",
        "temperature = 1.0",
    )
    recipe = preference_recipe(tmp_path, tiny_llama_dir, str(path), extra=extra, batch=(8, 8), run="cli")
    if rows == "prompts":
        recipe.write_text(recipe.read_text().replace('format = "preference"', 'format = "prompt"'))
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    api, cli = _metrics(tmp_path / "api"), _metrics(tmp_path / "cli")
    assert len(api) == len(cli) == 2 and api[0]["online/pairs"] > 0
    for mine, theirs in zip(api, cli):
        for key in ("loss", "online/pairs", "online/reward"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-6), key


def test_a_distill_pipeline_on_chats_reads_them_as_chats(tmp_path, tiny_llama_dir, reference_dir):
    """Rows of messages (and no prompt) are the "chat" format: the same losses as naming it."""
    chats = [
        {"messages": [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]}
        for row in ANSWERS
    ]
    distill = {**DISTILL, "teacher": reference_dir}
    settings = {"data": {"max_seq_len": 48, "val_fraction": 0}, "tokenizer": {"chat_template": "plain"}}
    inferred = _distill_pipeline(
        tmp_path, tiny_llama_dir, "inferred", dataset=chats, distill=distill, extra_config=settings
    )
    assert inferred.config().data.format == "chat"
    inferred.run()
    named = {**settings, "data": {**settings["data"], "format": "chat"}}
    _distill_pipeline(tmp_path, tiny_llama_dir, "named", dataset=chats, distill=distill, extra_config=named).run()
    losses = [[step["loss"] for step in _metrics(tmp_path / name)] for name in ("inferred", "named")]
    assert len(losses[0]) == 2 and all(loss > 0 for loss in losses[0])
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)


def test_print_pipeline_names_the_loss_the_objective_trains(tmp_path, tiny_llama_dir):
    """print(pipeline) lists the loss that will train: GRPO's policy loss for reward_fn=, DPO for
    preference=, the task's CausalLMLoss only when no objective is chosen."""
    factory = ModelFactory.from_huggingface(tiny_llama_dir)
    prompts = [{"prompt": "1+1="}, {"prompt": "2+2="}]
    reward = lambda task, text: 0.0  # noqa: E731
    grpo = Pipeline(
        model_factory=factory,
        dataset=prompts,
        reward_fn=reward,
        rollout=RolloutConfig(max_new_tokens=8),
        extra_config={"data": {"max_seq_len": 32}},  # 32 + 8 fit the tiny model's 256 positions
        output_dir=str(tmp_path),
        steps=2,
    )
    assert "loss (reinforcement learning: GRPO (dapo loss, 8 completions per prompt" in str(grpo), str(grpo)
    dpo = Pipeline(model_factory=factory, dataset=PAIRS, preference={"kind": "dpo"}, output_dir=str(tmp_path))
    assert "loss (preference optimisation: DPO (beta" in str(dpo), str(dpo)
    plain = Pipeline(model_factory=factory, dataset=[{"text": "hello"}], output_dir=str(tmp_path))
    assert "loss (the default CausalLMLoss)" in str(plain), str(plain)


def test_the_python_api_takes_an_environment_class_or_instance(tmp_path, tiny_llama_dir):
    """rl=RLConfig(environment=...) takes a class (a module's, or one defined in a function) or an
    instance, whose copies play the episodes (the instance itself is never stepped)."""
    from ditty.rl import StepResult
    from tests.rl.environments_for_tests import CountingTurns

    class Levelled:
        def __init__(self, level=1):
            self.level, self.turns = level, 0

        def reset(self, row):
            return row["prompt"]

        def step(self, completion):
            self.turns += 1
            done = self.turns >= 2
            return StepResult(observation=None if done else "again", reward=0.1 * self.level, done=done)

    factory = ModelFactory.from_huggingface(tiny_llama_dir)
    prompts = [{"prompt": f"{a}+{a}="} for a in range(8)]
    instance = Levelled(level=3)
    for name, environment in (("module", CountingTurns), ("local", Levelled), ("instance", instance)):
        pipeline = Pipeline(
            model_factory=factory,
            dataset=prompts,
            rl=RLConfig(group_size=4, environment=environment, max_turns=3, max_episode_tokens=24),
            rollout=RolloutConfig(max_new_tokens=4),
            output_dir=str(tmp_path / name),
            extra_config={"data": {"max_seq_len": 32, "val_fraction": 0}},
            **SHARED,
        )
        if name == "module":
            assert pipeline.config().rl.environment == "tests.rl.environments_for_tests:CountingTurns"
        pipeline.run()
        rows = _metrics(tmp_path / name)
        assert len(rows) == 2 and all("env/turns" in r for r in rows), rows
        if name == "instance":
            assert all(r["reward"] == pytest.approx(0.1 * 3 * r["env/turns"]) for r in rows), rows
    assert instance.turns == 0  # only its copies played
