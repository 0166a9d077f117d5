"""The online-pairs row (`[preference] pairs = "online"`): preference optimisation on pairs the policy
samples itself, judged by reward functions.

Every `refresh_every` steps, the live policy samples `rl.group_size` completions of each prompt of the
next `refresh_every` steps (the RL sampler, with the [rl] sampler settings), the reward functions score
them (`rl.rewards`), and the best and the worst completion of each group become a pair (a group whose
completions all scored alike is dropped: it prefers nothing). The pairs train the `[preference] kind`
loss with its reference, as pairs read from a file do. So the rejected answers are the policy's own
mistakes, which is where preference training has the most to teach.

The prompts are the data's: rows of data.format = "prompt" (their other columns go to the reward
functions), or the prompts of data.format = "preference" pairs. A pair's chosen completion then joins
its prompt's group as one more candidate, and is the `answer` column the reward functions see (the
default reward, without `rl.rewards`, is exact match against it:
"ditty.objectives.rewards.builtin_rewards:exact_match"): a prompt the policy never answers right still makes a
pair, the chosen answer against the policy's own worst mistake, and samples are cut one token past the
longest chosen answer of the batch. A completion is sampled up to `rollout.max_new_tokens` and at most
`data.max_seq_len` tokens; a pair is cut to `data.max_seq_len` like any.

Each rank samples its own prompts; every step serves the same number of micro-batches on every rank,
filled up with pairs that score nothing (the loss counts only scored pairs). The sampling is seeded by
the prompts' global positions, and the sampled pairs not yet trained on are part of the checkpoint,
so a resume after kill -9 continues exactly.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Optional, Sequence

from ditty._utils.labels import IGNORE_INDEX
from ditty.objectives.footprint import Footprint
from ditty.objectives.online_pairs_rules import DEFAULT_REWARD
from ditty.objectives.parts import ObjectiveParts
from ditty.objectives.sampling.stream_state import decode_for_rank, encode_by_rank

log = logging.getLogger(__name__)


class PromptsOfPairs:
    """A collator of preference samples into prompt batches: each pair's prompt (its tokens before the
    first scored label), and its chosen completion as the `answer` column."""

    tokenized = True

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        prompt_ids, prompts, answers, answer_ids = [], [], [], []
        eos = self.tokenizer.eos_token_id
        for sample in samples:
            ids, labels = list(sample["input_ids"]), list(sample["labels"])
            start = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(ids))
            prompt_ids.append(ids[:start])
            answer_ids.append(ids[start:])  # the chosen completion as it trains: through its eos
            prompts.append(self.tokenizer.decode(ids[:start], skip_special_tokens=True))
            answers.append(self.tokenizer.decode([t for t in ids[start:] if t != eos], skip_special_tokens=True))
        return {"prompt_ids": prompt_ids, "prompts": prompts, "columns": {"answer": answers}, "answer_ids": answer_ids}


class OnlinePairStream:
    """See the module doc. `sampler`, `environment`: the RL parts (ditty.objectives.rl)."""

    def __init__(
        self,
        prompts: Any,
        *,
        sampler: Any,
        environment: Any,
        collator: Any,
        group_size: int,
        refresh_every: int,
        micro_batches_per_step: int,
        micro_batch_size: int,
        max_seq_len: int,
        rank: int,
        world_size: int,
        budgets: Any = None,
        group: Any = None,
    ) -> None:
        """`rank`, `world_size`: this rank's place among the ranks that take different prompts (the
        data-parallel ones: a tensor-parallel group shares its prompts and samples alike); `group`:
        their process group (None: the whole world)."""
        self.prompts, self.sampler, self.environment, self.collator = prompts, sampler, environment, collator
        self.budgets = budgets
        """A BudgetWatch (ditty.objectives.rl.budgets) warning when most samples hit rollout.max_new_tokens;
        None: not watched."""
        self.group_size, self.refresh_every = group_size, refresh_every
        self.micro_batches_per_step = micro_batches_per_step
        self.micro_batch_size, self.max_seq_len = micro_batch_size, max_seq_len
        self.rank, self.world_size, self.group = rank, world_size, group
        self.pending: list[list[dict]] = []  # the pair samples of the steps still to serve
        self.metrics: dict[str, float] = {}
        self.warned_no_pairs = False

    @property
    def cursor(self) -> int:
        return self.prompts.cursor

    @property
    def accumulation_steps(self) -> int:
        return self.micro_batches_per_step

    def next_step(self) -> list[dict]:
        if not self.pending:
            self.pending, self.metrics = self.refresh()
        pairs = self.pending.pop(0)
        size = self.micro_batch_size
        filler = _filler(self.collator)
        batches = []
        for index in range(self.micro_batches_per_step):
            chunk = pairs[index * size : (index + 1) * size]
            batches.append(self.collator(chunk + [filler] * (size - len(chunk))))
        return batches

    def refresh(self) -> tuple[list[list[dict]], dict[str, float]]:
        """Sample the pairs of the next `refresh_every` steps from the live policy."""
        start = self.prompts.cursor
        (batch,) = self.prompts.next_step()
        first = start + self.rank * len(batch["prompt_ids"])
        answers = batch.get("answer_ids")
        # A sample longer than any reference answer of the batch (and a token) is cut there: it is wrong.
        cap = max(len(ids) for ids in answers) + 1 if answers else None
        rollouts = with_references(self.sampler.sample(batch["prompt_ids"], first, cap), batch, self.group_size)
        group = self.group_size + (1 if answers else 0)
        repeat = lambda values: [v for v in values for _ in range(group)]  # noqa: E731
        columns = {name: repeat(values) for name, values in batch["columns"].items()}
        self.environment.score(rollouts, repeat(batch["prompts"]), columns)
        per_step = max(1, len(batch["prompt_ids"]) // self.refresh_every)  # this rank's prompts of one step
        steps: list[list[dict]] = [[] for _ in range(self.refresh_every)]
        tied = 0
        for index in range(len(batch["prompt_ids"])):
            rows = range(index * group, (index + 1) * group)
            rewards = rollouts.rewards[index * group : (index + 1) * group]
            if bool((rewards == rewards[0]).all()):
                tied += 1
                continue
            best, worst = rows[int(rewards.argmax())], rows[int(rewards.argmin())]
            pair = self.pair(rollouts.prompt_ids[best], rollouts.completion_ids[best], rollouts.completion_ids[worst])
            if pair is not None:
                steps[min(index // per_step, self.refresh_every - 1)].append(pair)
        # every rank judged its own prompts: the metrics count all of them
        paired, tied, prompts, reward, samples, clipped = global_sums(
            [
                sum(len(pairs) for pairs in steps),
                tied,
                len(batch["prompt_ids"]),
                float(rollouts.rewards.sum()),
                len(rollouts),
                sum(rollouts.truncated),  # a reference answer is never cut
            ],
            self.group,
        )
        if not paired:
            self.warn_no_pairs(int(tied), int(prompts))
        metrics = {
            "online/pairs": paired / max(prompts, 1),
            "online/tied_groups": tied / max(prompts, 1),
            "online/reward": reward / max(samples, 1),
        }
        # Samples cut at a reference answer's length are wrong by design (above): only prompts without
        # references are cut by the budget alone, which then says so when it cuts most of them.
        if cap is None:
            metrics["completions/clipped_ratio"] = clipped / max(samples, 1)
            warning = self.budgets.observe(metrics) if self.budgets is not None else None
            if warning is not None and self.rank == 0:
                log.warning("online pairs: %s", warning)
        return steps, metrics

    def warn_no_pairs(self, tied: int, prompts: int) -> None:
        """Once a run: a refresh that made no pair leaves its steps with nothing to train (loss 0)."""
        from ditty._utils.dist import is_main_process

        if self.warned_no_pairs or not is_main_process():
            return
        self.warned_no_pairs = True
        why = f"the samples of {tied} of {prompts} prompts all scored alike"
        if tied < prompts:
            why += ", and the rest kept no completion token within data.max_seq_len"
        steps = "the next step trains" if self.refresh_every == 1 else f"the next {self.refresh_every} steps train"
        log.warning(
            "online pairs: no pair from this refresh (%s): %s nothing; a higher rollout.temperature or "
            'rl.group_size makes groups differ, and with data.format = "preference" each pair\'s chosen answer '
            "joins its group (online/pairs and online/tied_groups in metrics.jsonl count them)",
            why,
            steps,
        )

    def pair(self, prompt: list[int], chosen: list[int], rejected: list[int]) -> Optional[dict]:
        """A preference sample (both sides cut to data.max_seq_len), or None when a side keeps no completion token."""
        sides = []
        for completion in (chosen, rejected):
            ids = (prompt + completion)[: self.max_seq_len]
            labels = ([IGNORE_INDEX] * len(prompt) + completion)[: self.max_seq_len]
            if all(label == IGNORE_INDEX for label in labels[1:]):
                return None
            sides.append((ids, labels))
        (ids, labels), (rejected_ids, rejected_labels) = sides
        return {
            "input_ids": ids,
            "labels": labels,
            "rejected_input_ids": rejected_ids,
            "rejected_labels": rejected_labels,
        }

    def step_metrics(self) -> dict[str, float]:
        return dict(self.metrics)

    def source_tokens(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self.sampler.close()
        self.prompts.close()

    def state_dict(self) -> dict[str, Any]:
        """Collective with several ranks: each rank's pairs not yet trained on are its own."""
        return {
            "prompts": self.prompts.state_dict(),
            "pending": encode_by_rank({"pairs": self.pending, "metrics": self.metrics}, self.world_size, self.group),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state["prompts"])
        saved = decode_for_rank(state["pending"], "pending", self.rank, self.world_size)
        self.pending, self.metrics = saved["pairs"], saved["metrics"]


def global_sums(values: list[float], group: Any = None) -> list[float]:
    """Each value summed over the ranks of `group` (None: the world; a no-op on one process; NCCL sums
    CUDA tensors only)."""
    import torch
    import torch.distributed as dist

    from ditty._utils.dist import all_reduce_sum

    sums = torch.tensor(values, dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        sums = sums.cuda()
    return all_reduce_sum(sums, group).cpu().tolist()


def with_references(rollouts: Any, batch: dict, group: int) -> Any:
    """The sampled groups, each with its prompt's reference answer (preference data's chosen
    completion) as one more candidate: a prompt the policy never answers right still makes a pair,
    its chosen answer against the policy's own worst mistake."""
    if not batch.get("answer_ids"):
        return rollouts
    from ditty.objectives.sampling.batch import RolloutBatch

    out = RolloutBatch([], [], [], [])
    for index, (answer, text) in enumerate(zip(batch["answer_ids"], batch["columns"]["answer"])):
        rows = range(index * group, (index + 1) * group)
        prompt = rollouts.prompt_ids[rows[0]]
        out.prompt_ids += [rollouts.prompt_ids[i] for i in rows] + [prompt]
        out.completion_ids += [rollouts.completion_ids[i] for i in rows] + [list(answer)]
        out.texts += [rollouts.texts[i] for i in rows] + [text]
        out.truncated += [rollouts.truncated[i] for i in rows] + [False]
    return out


def _filler(collator: Any) -> dict:
    """A pair that scores nothing (one token each side, no label): it fills a short micro-batch."""
    return {"input_ids": [0], "labels": [IGNORE_INDEX], "rejected_input_ids": [0], "rejected_labels": [IGNORE_INDEX]}


def sampling_settings(rollout: Any, max_seq_len: int) -> Any:
    """[rollout], with the completions capped at data.max_seq_len tokens (a pair holds at most that)."""
    return replace(rollout, max_new_tokens=min(rollout.max_new_tokens, max_seq_len))


def build_online_pairs(run: Any) -> ObjectiveParts:
    from ditty.data.build import build_stream
    from ditty.data.formats.preference_rows import PairCollator
    from ditty.objectives.environments.protocol import RewardEnvironment
    from ditty.objectives.pairs import build_pairs
    from ditty.objectives.rewards.functions import load_reward_functions
    from ditty.objectives.rl.budgets import BudgetWatch
    from ditty.objectives.rl.row import reward_references
    from ditty.objectives.sampling.policy_sampling import PolicySampling
    from ditty.objectives.sampling.sampler import build_sampler

    config, runtime = run.config, run.runtime
    rl, pref, train, data = config.rl, config.preference, config.train, config.data
    pairs = build_pairs(run)  # the preference kind's loss and reference
    functions = load_reward_functions(reward_references(run) or [DEFAULT_REWARD], rl.reward_weights)
    bundle = run.data.bundle
    if data.format == "preference":
        bundle = replace(bundle, collator=PromptsOfPairs(run.tokenizer))
    prompts_per_refresh = train.global_batch_size * pref.refresh_every
    prompts = build_stream(
        bundle,
        data,
        global_batch_size=prompts_per_refresh,
        micro_batch_size=prompts_per_refresh // runtime.data_world_size,
        rank=runtime.data_rank,
        world_size=runtime.data_world_size,
    )
    policy = lambda: run.engine.unwrap(run.model)  # noqa: E731
    pad = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
    rollout = sampling_settings(config.rollout, data.max_seq_len)
    sampling = PolicySampling(build_sampler(run, policy, group_size=rl.group_size, rollout=rollout))
    stream = OnlinePairStream(
        prompts,
        sampler=sampling,
        environment=RewardEnvironment(functions, rl.reward_timeout_s),
        collator=PairCollator(pad),
        group_size=rl.group_size,
        refresh_every=pref.refresh_every,
        micro_batches_per_step=run.plan.accumulation_steps,
        micro_batch_size=train.micro_batch_size,
        max_seq_len=data.max_seq_len,
        rank=runtime.data_rank,
        world_size=runtime.data_world_size,
        budgets=BudgetWatch(rl, run.config.rollout),
        group=runtime.batch_group,
    )
    evaluation = None
    if data.format == "prompt":  # prompts have no pairs to validate on: the greedy reward, as RL's
        from ditty.objectives.rl.evaluation import RolloutEvaluation

        evaluation = RolloutEvaluation(
            run.data.bundle, functions, run.tokenizer, rollout.max_new_tokens, rl.reward_timeout_s
        )
    return replace(
        pairs, stream=stream, evaluation=evaluation, step_metrics=stream.step_metrics, after_update=sampling.updated
    )


def describe_online(config: Any) -> list[tuple[str, str]]:
    from ditty.objectives.pairs import describe_pairs

    pref, rl, rollout = config.preference, config.rl, config.rollout
    rewards = ", ".join(r.rsplit(":", 1)[-1] for r in rl.rewards) or "exact match against the chosen answer"
    sampling = (
        f"pairs sampled online every {pref.refresh_every} step(s): {rl.group_size} completions per prompt "
        f"(temperature {rollout.temperature:g}, {rollout.engine}), best vs worst by {rewards}"
    )
    return describe_pairs(config) + [("pairs", sampling)]


def online_footprint(config: Any, world_size: int) -> Footprint:
    from ditty.objectives.pairs import pairs_footprint

    rl, pref = config.rl, config.preference
    prompts = max(1, config.train.global_batch_size * pref.refresh_every // max(1, world_size))
    rollout = config.rollout
    in_flight = min(rollout.generation_batch_size or prompts, prompts) * rl.group_size
    return replace(
        pairs_footprint(config, world_size),
        rollout_sequences=in_flight,
        rollout_tokens=config.data.max_seq_len + min(rollout.max_new_tokens, config.data.max_seq_len),
    )


def online_card(config: Any) -> str:
    from ditty.objectives.pairs import pairs_card

    return pairs_card(config) + f", on pairs sampled online (best vs worst of {config.rl.group_size})"
