"""Gradient clipping really scales the gradients (a regression: torch's clip_grads_with_norm_ takes
parameters, and given bare gradients it clipped nothing, silently)."""

from __future__ import annotations

import torch

from ditty.train.step import clip_grads, grad_norm


def test_clip_grads_scales_gradients_to_the_max_norm():
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))]
    params[0].grad, params[1].grad = torch.full((3,), 2.0), torch.full((2,), -2.0)  # the third has no gradient
    norm = grad_norm(params)
    assert torch.isclose(norm, torch.tensor(20.0).sqrt())
    clip_grads(params, 1.0, norm)
    assert torch.isclose(grad_norm(params), torch.tensor(1.0), atol=1e-6)
    assert torch.allclose(params[0].grad, torch.full((3,), 2.0 / 20.0**0.5), atol=1e-6)


def test_clip_grads_leaves_small_or_unclipped_gradients_alone():
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.tensor([0.3, 0.4])
    clip_grads([param], 1.0, grad_norm([param]))  # norm 0.5 < 1
    assert torch.equal(param.grad, torch.tensor([0.3, 0.4]))
    clip_grads([param], None, torch.tensor(100.0))
    clip_grads([param], 0.0, torch.tensor(100.0))
    assert torch.equal(param.grad, torch.tensor([0.3, 0.4]))
