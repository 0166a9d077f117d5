"""The checks a part of on-policy training must pass, the built-ins and a user's alike (tests run them
on every built-in; a user runs them on their own part in their tests):

    from ditty.rl import check_advantage_estimator, check_policy_loss, check_environment
    check_advantage_estimator(my_estimator)

Each raises AssertionError naming what the part got wrong. What they hold:
- an advantage estimator gives one finite advantage per reward, the same for the same rewards, and
  permuting whole groups permutes their advantages (it may not depend on where a group sits in the
  batch, which differs between world sizes);
- a policy loss returns a scalar share whose sum over any split of a batch into micro-batches, with
  the whole batch's counts, equals the loss of the whole batch, gradients included (the trainer
  relies on that to make accumulation and data parallelism exact);
- an environment's reset gives an observation and every step a StepResult the trainer takes
  (ditty.objectives.environments.protocol's checks), for the rows and completions given.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Sequence


def check_advantage_estimator(estimator: Callable, group_size: int = 4, groups: int = 3) -> None:
    import torch

    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(group_size * groups, generator=generator, dtype=torch.float64).round(decimals=1)
    rewards[:group_size] = 0.5  # a group whose rewards all agree
    lengths = torch.randint(1, 9, rewards.shape, generator=generator).to(torch.float64)
    first = estimator(rewards.clone(), group_size, lengths.clone())
    assert isinstance(first, torch.Tensor), f"the estimator returned a {type(first).__name__}, not a tensor"
    assert tuple(first.shape) == tuple(rewards.shape), f"{tuple(first.shape)} advantages for {tuple(rewards.shape)}"
    assert bool(torch.isfinite(first).all()), f"non-finite advantages {first.tolist()} for finite rewards"
    again = estimator(rewards.clone(), group_size, lengths.clone())
    assert torch.equal(first.to(torch.float64), again.to(torch.float64)), "the same rewards gave other advantages"
    order = torch.randperm(groups, generator=generator)
    rows = (order[:, None] * group_size + torch.arange(group_size)).reshape(-1)
    moved = estimator(rewards[rows].clone(), group_size, lengths[rows].clone())
    assert torch.allclose(moved.to(torch.float64), first.to(torch.float64)[rows], atol=1e-9, rtol=1e-7), (
        "moving whole groups within the batch changed their advantages"
    )


def check_policy_loss(loss: Callable, **settings: Any) -> None:
    """`settings`: the loss's keywords to check it under (clip_low, beta, importance, ...), TRL's
    defaults where not given."""
    import torch

    generator = torch.Generator().manual_seed(0)
    rows, width = 6, 5
    logps = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3
    old = logps + torch.randn(rows, width, generator=generator, dtype=torch.float64) * 0.1
    advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
    mask = torch.rand(rows, width, generator=generator) > 0.3
    mask[:, 0] = True
    reference = logps + torch.randn(rows, width, generator=generator, dtype=torch.float64) * 0.1
    keywords = dict(
        global_sequences=torch.tensor(float(rows), dtype=torch.float64),
        global_tokens=mask.sum().to(torch.float64),
        reference_logps=None,
        beta=0.0,
        clip_low=0.2,
        clip_high=None,
        importance="token",
        max_new_tokens=width,
        token_weights=None,
    )
    keywords.update(settings)

    def run(parts: Sequence[slice]) -> tuple[float, torch.Tensor]:
        policy = logps.clone().requires_grad_(True)
        total = 0.0
        for part in parts:
            extra = dict(keywords)
            if extra.get("reference_logps") is not None or extra.get("beta"):
                extra["reference_logps"] = reference[part]
            out = loss(policy[part], old[part], advantages[part], mask[part], **extra)
            value = getattr(out, "loss", out)
            assert isinstance(value, torch.Tensor) and value.dim() == 0, "the loss is not a scalar tensor"
            value.backward()
            total += float(value)
        return total, policy.grad

    whole, whole_grad = run([slice(0, rows)])
    split, split_grad = run([slice(0, 2), slice(2, 3), slice(3, rows)])
    assert abs(whole - split) <= 1e-9 * max(1.0, abs(whole)), (
        f"micro-batch shares add up to {split}, the whole batch's loss is {whole}: the loss must return its "
        "share of the global batch (divide by the global counts it is given, not by the micro-batch's own)"
    )
    assert torch.allclose(whole_grad, split_grad, atol=1e-12, rtol=1e-9), "split gradients differ from the whole's"


def check_environment(
    make: Callable[[], Any],
    rows: Iterable[Mapping[str, Any]],
    completions: Sequence[str],
    *,
    max_turns: Optional[int] = None,
) -> None:
    """Play each row with `completions` as the model's turns (until the environment is done, or
    `max_turns`): every answer is one the trainer takes."""
    from ditty.objectives.environments.protocol import StepResult, observation_problem, step_result_problem

    for row in rows:
        environment = make()
        observation = environment.reset(dict(row))
        problem = observation_problem(observation)
        assert problem is None, f"reset({dict(row)!r}) returned {problem}"
        for turn, completion in enumerate(completions[:max_turns]):
            result = environment.step(completion)
            assert isinstance(result, StepResult), f"step returned a {type(result).__name__}, not a StepResult"
            problem = step_result_problem(result)
            assert problem is None, f"step (turn {turn}) returned {problem}"
            if result.done:
                break
