"""Diffusion: the DDPM schedule, noising, reverse steps, the training stage, the digits denoiser,
and (slow) proof that the denoiser learns to draw digits."""

from __future__ import annotations

import math
import time

import pytest
import torch

from ditty.contracts import Stage, bind_tensors, check_chain, check_tensors
from ditty.diffusion import NoisePreProcessor, Scheduler, save_sample_grid
from ditty.models.denoiser import DigitsDenoiser, digits_denoiser

# --- the schedule -----------------------------------------------------------------------------


@pytest.mark.parametrize("schedule_type", ["cosine", "linear"])
def test_schedule_shapes_and_monotonicity(schedule_type):
    scheduler = Scheduler(max_timesteps=1000, schedule_type=schedule_type)
    for table in (scheduler.betas, scheduler.alphas, scheduler.alpha_bar, scheduler.posterior_variance):
        assert table.shape == (1000,) and table.dtype == torch.float32
    assert ((scheduler.betas > 0) & (scheduler.betas < 1)).all()
    assert torch.allclose(scheduler.alphas, 1 - scheduler.betas)
    assert (scheduler.alpha_bar[1:] < scheduler.alpha_bar[:-1]).all()  # noise only grows with t
    assert scheduler.alpha_bar[0] > 0.99 and scheduler.alpha_bar[-1] < 0.01


def test_linear_schedule_spans_beta_start_to_beta_end():
    scheduler = Scheduler(max_timesteps=1000, schedule_type="linear", beta_start=1e-4, beta_end=0.02)
    assert scheduler.betas[0].item() == pytest.approx(1e-4)
    assert scheduler.betas[-1].item() == pytest.approx(0.02)
    assert (scheduler.betas[1:] > scheduler.betas[:-1]).all()


def test_cosine_alpha_bar_follows_the_formula():
    scheduler = Scheduler(max_timesteps=1000)
    t = 500
    f = lambda step: math.cos((step / 1000 + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    expected = f(t + 1) / f(0)  # alpha_bar_t = f(t + 1) / f(0): table index t is step t + 1
    assert scheduler.alpha_bar[t].item() == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"schedule_type": "quadratic"}, "'cosine', 'linear'"),
        ({"max_timesteps": 0}, "positive integer"),
        ({"max_timesteps": 10.5}, "positive integer"),
        ({"max_timesteps": True}, "positive integer"),
        ({"beta_start": 0.02, "beta_end": 0.01}, "beta_start < beta_end"),
        ({"beta_start": 0.0}, "0 < beta_start"),
        ({"beta_end": 1.5}, "beta_end < 1"),
        ({"max_timesteps": 10, "timesteps": 20}, "max_timesteps=10 and timesteps=20 disagree"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Scheduler(**kwargs)


# --- forward and reverse steps ----------------------------------------------------------------


def test_add_noise_has_the_scheduled_mean_and_variance():
    scheduler = Scheduler(max_timesteps=1000)
    generator = torch.Generator().manual_seed(0)
    x0 = torch.full((20_000, 4), 0.5)
    noise = torch.randn(x0.shape, generator=generator)
    for t in (0, 300, 999):
        x_t = scheduler.add_noise(x0, noise, t)
        alpha_bar = scheduler.alpha_bar[t].item()
        assert x_t.mean().item() == pytest.approx(0.5 * math.sqrt(alpha_bar), abs=0.01)
        assert x_t.std().item() == pytest.approx(math.sqrt(1 - alpha_bar), rel=0.02, abs=1e-3)


def test_add_noise_per_sample_timesteps():
    scheduler = Scheduler(max_timesteps=100)
    x0, noise = torch.ones(3, 1, 8, 8), torch.zeros(3, 1, 8, 8)
    x_t = scheduler.add_noise(x0, noise, torch.tensor([0, 50, 99]))
    assert x_t.shape == x0.shape
    assert torch.allclose(x_t[:, 0, 0, 0], scheduler.alpha_bar[[0, 50, 99]].sqrt())


def test_step_shape_and_last_step_is_deterministic():
    scheduler = Scheduler(max_timesteps=50)
    x_t, eps = torch.randn(4, 1, 8, 8), torch.randn(4, 1, 8, 8)
    assert scheduler.step(eps, 10, x_t).shape == x_t.shape
    first = scheduler.step(eps, 0, x_t, torch.Generator().manual_seed(1))
    second = scheduler.step(eps, torch.zeros(4, dtype=torch.long), x_t, torch.Generator().manual_seed(2))
    assert torch.equal(first, second)  # no noise is added at t = 0


def test_step_with_the_true_noise_recovers_x0_at_the_last_step():
    scheduler = Scheduler(max_timesteps=50)
    x0 = torch.rand(4, 1, 8, 8) * 2 - 1
    noise = torch.randn(x0.shape)
    x_t = scheduler.add_noise(x0, noise, 0)
    assert torch.allclose(scheduler.step(noise, 0, x_t), x0, atol=1e-5)
    assert torch.allclose(scheduler.predict_x0(noise, 30, scheduler.add_noise(x0, noise, 30)), x0, atol=1e-4)


def test_sample_shape_reproducibility_and_model_mode():
    scheduler = Scheduler(max_timesteps=5)
    model = digits_denoiser(hidden=16, depth=1)
    model.train()
    first = scheduler.sample(model, (3, 1, 8, 8), torch.Generator().manual_seed(0))
    second = scheduler.sample(model, (3, 1, 8, 8), torch.Generator().manual_seed(0))
    assert first.shape == (3, 1, 8, 8) and torch.equal(first, second)
    assert model.training


# --- the training stage and the denoiser ------------------------------------------------------


@pytest.mark.parametrize("make_batch", [lambda x: x, lambda x: (x, torch.zeros(len(x))), lambda x: {"pixel_values": x}])
def test_noise_preprocessor_sets_model_input_target_and_t(make_batch):
    stage = NoisePreProcessor(max_timesteps=100, seed=0)
    x0 = torch.rand(6, 1, 8, 8) * 2 - 1
    x_t, ctx = stage.process(make_batch(x0), {"forward_kwargs": {}})
    t = ctx["forward_kwargs"]["t"]
    assert x_t.shape == x0.shape and ctx["target"].shape == x0.shape
    assert t.shape == (6,) and t.dtype == torch.long and ((0 <= t) & (t < 100)).all()
    assert ctx["t"] is t
    assert torch.allclose(x_t, stage.scheduler.add_noise(x0, ctx["target"], t))


def test_noise_preprocessor_rejects_batches_without_images():
    with pytest.raises(KeyError, match="image_key"):
        NoisePreProcessor().process({"x": torch.zeros(1)}, {})
    with pytest.raises(ValueError, match="'cosine', 'linear'"):
        NoisePreProcessor(schedule_type="sigmoid")


def test_denoiser_shapes_and_factory():
    model = digits_denoiser()
    assert isinstance(model, torch.nn.Module) and isinstance(model, DigitsDenoiser)
    x = torch.randn(5, 1, 8, 8)
    assert model(x, torch.randint(0, 1000, (5,))).shape == x.shape
    assert model(x.reshape(5, 64), 7).shape == (5, 64)
    assert digits_denoiser.contract == model.contract


def test_the_diffusion_chain_checks_and_matches_real_tensors():
    stage, model = NoisePreProcessor(seed=0), digits_denoiser(hidden=32, depth=1)
    loss_contract = "pred:4:f32, ctx.target:4:f32 -> loss:0:f32"
    stages = [
        Stage("pipeline.preprocessors[0]", stage.contract, "preprocessor"),
        Stage("model", model.contract, "model"),
        Stage("pipeline.loss", loss_contract, "loss", output_index=0),
    ]
    assert check_chain(stages, batch_spec="pixel_values:4:f32") == []

    batch = {"pixel_values": torch.rand(2, 1, 8, 8)}
    ctx = {"forward_kwargs": {}}
    assert check_tensors(stage.contract, bind_tensors(stage.contract, batch, ctx)) == []
    x_t, ctx = stage.process(batch, ctx)
    assert check_tensors(stage.contract, bind_tensors(stage.contract, x_t, ctx, side="outputs"), side="outputs") == []
    assert check_tensors(model.contract, bind_tensors(model.contract, x_t, ctx)) == []


def test_save_sample_grid_writes_a_png(tmp_path):
    for samples in (torch.rand(10, 1, 8, 8), torch.rand(3, 64), torch.rand(4, 8, 8)):
        path = save_sample_grid(samples * 2 - 1, tmp_path / "grid.png")
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="expected"):
        save_sample_grid(torch.rand(2, 3, 8, 8), tmp_path / "bad.png")


# --- it learns (slow) -------------------------------------------------------------------------

TRAIN_STEPS = 3000
SAMPLES = 300


@pytest.fixture
def one_thread():
    """Tiny matmuls on a shared CPU: intra-op threads cost more in synchronisation than they gain
    (3000 steps took 480 s with 2 threads under load, 15 s with 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_denoiser_learns_to_draw_digits(tmp_path, one_thread):
    pytest.importorskip("sklearn")
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import NearestNeighbors

    started = time.perf_counter()
    digits = load_digits()
    images = torch.from_numpy(digits.data / 16 * 2 - 1).float().reshape(-1, 1, 8, 8)  # [1797, 1, 8, 8] in [-1, 1]
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    train, held_out = images[order[:1500]], images[order[1500:]]

    torch.manual_seed(0)
    scheduler = Scheduler(max_timesteps=1000, schedule_type="cosine")
    model, untrained = digits_denoiser(), digits_denoiser()  # the defaults a recipe gets
    loss_before = held_out_loss(model, scheduler, held_out)
    train_denoiser(model, scheduler, train, TRAIN_STEPS)
    loss_after = held_out_loss(model, scheduler, held_out)
    train_seconds = time.perf_counter() - started

    samples = scheduler.sample(model, (SAMPLES, 1, 8, 8), torch.Generator().manual_seed(1))
    untrained_samples = scheduler.sample(untrained, (SAMPLES, 1, 8, 8), torch.Generator().manual_seed(1))
    noise = torch.randn(SAMPLES, 1, 8, 8, generator=torch.Generator().manual_seed(2)).clamp(-1, 1)
    save_sample_grid(samples[:100], tmp_path / "samples.png")

    flat = lambda x: x.reshape(len(x), -1).clamp(-1, 1).numpy()  # noqa: E731
    classifier = LogisticRegression(max_iter=2000).fit(flat(train), digits.target[order[:1500].numpy()])
    neighbours = NearestNeighbors(n_neighbors=1).fit(flat(train))

    def measure(x):
        probabilities = classifier.predict_proba(flat(x))
        counts = np.bincount(probabilities.argmax(1), minlength=10)
        return {
            "nn_distance": float(neighbours.kneighbors(flat(x))[0].mean()),
            "confidence": float(probabilities.max(1).mean()),
            "classes": int((counts >= 0.02 * len(x)).sum()),
        }

    trained, pure_noise = measure(samples), measure(noise)
    untrained_m, real = measure(untrained_samples), measure(held_out)
    print(
        f"\ndigits diffusion: held-out loss {loss_before:.3f} -> {loss_after:.3f} "
        f"({TRAIN_STEPS} steps, {train_seconds:.1f}s; total {time.perf_counter() - started:.1f}s)\n"
        f"  trained {trained}\n  untrained {untrained_m}\n  noise {pure_noise}\n  real held-out {real}"
    )

    assert loss_after < 0.4 * loss_before
    # Samples sit near real digits, as close as held-out real digits do, and far closer than noise
    # or an untrained model's samples (which a classifier alone would also call confident digits).
    assert trained["nn_distance"] < 0.5 * min(pure_noise["nn_distance"], untrained_m["nn_distance"])
    assert trained["nn_distance"] < 1.5 * real["nn_distance"]
    assert trained["classes"] >= 7  # each of at least 7 digits is >= 2% of the samples


def train_denoiser(model, scheduler, images, steps, batch_size=128, lr=2e-3):
    """The epsilon-prediction objective with the pipeline's own noising stage, in a plain loop."""
    stage = NoisePreProcessor(scheduler=scheduler, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.05)
    picks = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = images[torch.randint(0, len(images), (batch_size,), generator=picks)]
        x_t, ctx = stage.process(batch, {"forward_kwargs": {}})
        loss = torch.nn.functional.mse_loss(model(x_t, **ctx["forward_kwargs"]), ctx["target"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()


@torch.no_grad()
def held_out_loss(model, scheduler, images):
    """Denoising MSE on held-out digits with fixed noise and timesteps, so before and after compare."""
    stage = NoisePreProcessor(scheduler=scheduler, seed=123)
    x_t, ctx = stage.process(images, {"forward_kwargs": {}})
    return torch.nn.functional.mse_loss(model(x_t, **ctx["forward_kwargs"]), ctx["target"]).item()
