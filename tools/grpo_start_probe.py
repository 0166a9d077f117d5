"""How sharp is a start for RL? A probe of a causal LM's final/ on built-in addition.

An Adam step whose gradient is mostly noise moves every weight by about the learning rate, each in
its own direction: a sign vector of size lr. This probe applies such steps (seeded random signs) to a
start and reports what they cost it, beside the start's own figures:

- `loss`: cross-entropy of the answer tokens (teacher forcing) on fresh addition problems;
- `entropy`: the mean entropy (nats) of the next-token distribution at the answer's positions, at
  temperature 1 (what the RL sampler draws from);
- `exact`: greedy exact match on the same problems;
- `sharpness`: the largest eigenvalue of the loss's Hessian (power iteration), the curvature along
  the steepest direction, which random steps almost never follow and gradient steps do;
- for each step size: the mean loss increase over `--directions` random sign vectors, and the
  greedy exact match after one of them.

    python tools/grpo_start_probe.py runs/tiny_sft/final [more final/ dirs] [--sizes 1.5e-5 5e-5 1.5e-4]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch


def problems(count: int, seed: int = 7) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    return [(f"{a}+{b}=", str(a + b)) for a, b in rng.integers(0, 100, size=(count, 2)).tolist()]


def batch(tokenizer, rows):
    """Right-padded prompt + answer + eos; labels on the answer and eos only."""
    ids, labels = [], []
    for prompt, answer in rows:
        p = tokenizer(prompt)["input_ids"]  # with the BOS the prompt format adds
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    mask = [[1] * len(x) + [0] * (width - len(x)) for x in ids]
    ids = [x + [pad] * (width - len(x)) for x in ids]
    labels = [x + [-100] * (width - len(x)) for x in labels]
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(labels)


@torch.no_grad()
def loss_and_entropy(model, ids, mask, labels) -> tuple[float, float]:
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = labels[:, 1:]
    scored = target != -100
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, target.clamp(min=0)[..., None])[..., 0]
    entropy = -(logp.exp() * logp).sum(-1)
    return float(nll[scored].mean()), float(entropy[scored].mean())


def sharpness(model, ids, mask, labels, iterations: int = 20) -> float:
    """The largest eigenvalue of the answer loss's Hessian in the weights (power iteration on
    Hessian-vector products): how fast the loss curves along its steepest direction."""
    params = [p for p in model.parameters() if p.requires_grad]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels[:, 1:], ignore_index=-100)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    g = torch.Generator().manual_seed(0)
    v = [torch.randn(p.shape, generator=g) for p in params]
    eigenvalue = 0.0
    for _ in range(iterations):
        norm = torch.sqrt(sum((x * x).sum() for x in v))
        v = [x / norm for x in v]
        hv = torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)
        eigenvalue = float(sum((a * b).sum() for a, b in zip(hv, v)))
        v = [x.detach() for x in hv]
    return eigenvalue


def exact(model, tokenizer, rows) -> float:
    from ditty.data.task import greedy_generate

    outputs = greedy_generate(model, tokenizer, [p for p, _ in rows], "cpu", max_new_tokens=4)
    return sum(o.strip() == a for o, (_, a) in zip(outputs, rows)) / len(rows)


def sign_step(model, size: float, seed: int) -> dict:
    """Move every parameter by size * sign(z), z ~ N(0, 1) seeded; return the originals."""
    g = torch.Generator().manual_seed(seed)
    saved = {}
    for name, p in model.named_parameters():
        saved[name] = p.detach().clone()
        p.data.add_(size * torch.randn(p.shape, generator=g).sign())
    return saved


def restore(model, saved: dict) -> None:
    for name, p in model.named_parameters():
        p.data.copy_(saved[name])


def probe(path: str, sizes: list[float], directions: int, count: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    # eager attention: the sharpness needs a second derivative, which the SDPA kernels do not have
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = problems(count)
    ids, mask, labels = batch(tokenizer, rows)
    loss, entropy = loss_and_entropy(model, ids, mask, labels)
    out = {
        "start": path,
        "loss": loss,
        "entropy": entropy,
        "exact": exact(model, tokenizer, rows),
        "sharpness": sharpness(model, ids, mask, labels),
        "steps": [],
    }
    for size in sizes:
        rises, after = [], None
        for direction in range(directions):
            saved = sign_step(model, size, seed=direction)
            rises.append(loss_and_entropy(model, ids, mask, labels)[0] - loss)
            if direction == 0:
                after = exact(model, tokenizer, rows)
            restore(model, saved)
        out["steps"].append({"size": size, "loss_rise": float(np.mean(rises)), "exact_after": after})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--sizes", nargs="+", type=float, default=[1.5e-5, 5e-5, 1.5e-4])
    parser.add_argument("--directions", type=int, default=3)
    parser.add_argument("--count", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for path in args.paths:
        print(json.dumps(probe(path, args.sizes, args.directions, args.count)))


if __name__ == "__main__":
    main()
