"""Per-token log-probabilities and entropy on vocabulary shards (ditty.stages.vocab_parallel_logps) on
1, 2 and 4 real gloo processes against dense `log_softmax` and its gradients: a 259-token vocabulary
(uneven shards at tp 2 and 4: 130/129 and 65/65/65/64 rows), targets in every shard, masked rows,
calls with no tokens, bias, softcap and temperature, plain shards and DTensors, a tensor-parallel
group inside a (dp 2, tp 2) mesh, and a tiny Llama parallelised by ditty (tied and untied head)
against `ditty.objectives.logprobs.token_logps` of the same model whole.

Each rank computes the dense reference itself (every rank builds the same tensors from one seed) and
returns its largest differences; the checks run here.
"""

from __future__ import annotations

import pytest
import torch

from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

VOCAB, WIDTH, TOKENS = 259, 16, 37
IGNORE = -100
EXACT = 1e-10  # float64: only rounding differs
FLOAT32 = 1e-6  # relative, float32 against a float64 reference


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, WIDTH, generator=g, dtype=torch.float64)
    weight = torch.randn(VOCAB, WIDTH, generator=g, dtype=torch.float64) / 2
    bias = torch.randn(VOCAB, generator=g, dtype=torch.float64)
    # targets in every shard, the last id included, and masked rows
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=g)
    targets[:4] = torch.tensor([0, VOCAB - 1, 129, 130])
    targets[[5, 11, 30]] = IGNORE
    grad_logps = torch.randn(TOKENS, generator=g, dtype=torch.float64)
    grad_entropy = torch.randn(TOKENS, generator=g, dtype=torch.float64)
    return {
        k: v.to(dtype) if v.is_floating_point() else v
        for k, v in dict(
            hidden=hidden, weight=weight, bias=bias, targets=targets, grad_logps=grad_logps, grad_entropy=grad_entropy
        ).items()
    }


def _dense(x, *, temperature=1.0, softcap=None, with_bias=True):
    """The reference: whole logits, log_softmax, its entropy, and the gradients of
    sum(grad_logps * logps + grad_entropy * entropy) by autograd."""
    hidden = x["hidden"].double().clone().requires_grad_()
    weight = x["weight"].double().clone().requires_grad_()
    bias = x["bias"].double().clone().requires_grad_() if with_bias else None
    logits = torch.nn.functional.linear(hidden / temperature, weight, bias)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logp = torch.log_softmax(logits, dim=-1)
    keep = x["targets"] != IGNORE
    logps = torch.where(keep, logp.gather(1, x["targets"].clamp(min=0)[:, None]).squeeze(1), 0.0)
    entropy = torch.where(keep, -(logp.exp() * logp).sum(-1), 0.0)
    (x["grad_logps"].double() * logps + x["grad_entropy"].double() * entropy).sum().backward()
    return {
        "logps": logps.detach(),
        "entropy": entropy.detach(),
        "hidden": hidden.grad,
        "weight": weight.grad,
        "bias": bias.grad if with_bias else None,
    }


def _shard(tensor, rank, world):
    chunks = tensor.chunk(world, dim=0)
    start = sum(c.shape[0] for c in chunks[:rank])
    return chunks[rank], start


def _error(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def _plain_shards(rank, world, dtype, *, temperature=1.0, softcap=None, chunks=4) -> dict[str, float]:
    import torch.distributed as dist

    from ditty.stages.vocab_parallel_logps import vocab_parallel_logps_and_entropy

    x = _inputs(dtype)
    want = _dense(x, temperature=temperature, softcap=softcap)
    weight, start = _shard(x["weight"], rank, world)
    bias, _ = _shard(x["bias"], rank, world)
    hidden = x["hidden"].clone().requires_grad_()
    weight, bias = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    logps, entropy = vocab_parallel_logps_and_entropy(
        hidden,
        weight,
        x["targets"],
        dist.group.WORLD,
        bias=bias,
        vocab_start=start,
        temperature=temperature,
        softcap=softcap,
        chunks=chunks,
    )
    (x["grad_logps"] * logps + x["grad_entropy"] * entropy).sum().backward()
    rows = slice(start, start + weight.shape[0])
    return {
        "logps": _error(logps, want["logps"]),
        "entropy": _error(entropy, want["entropy"]),
        "hidden": _error(hidden.grad, want["hidden"]),
        "weight": _error(weight.grad, want["weight"][rows]),
        "bias": _error(bias.grad, want["bias"][rows]),
        "masked": float(logps[x["targets"] == IGNORE].abs().max() + entropy[x["targets"] == IGNORE].abs().max()),
        "masked_grad": float(hidden.grad[x["targets"] == IGNORE].abs().max()),
    }


def _separate_calls(rank, world) -> dict[str, float]:
    """`vocab_parallel_token_logps` and `vocab_parallel_entropy` alone, on DTensors of a "tp" mesh
    (group and offsets from the DTensor), against the dense reference of each alone."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from ditty.stages.vocab_parallel_logps import vocab_parallel_entropy, vocab_parallel_token_logps

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    x = _inputs(torch.float64)
    out = {}
    for which in ("logps", "entropy"):
        only = dict(x, grad_entropy=torch.zeros_like(x["grad_entropy"])) if which == "logps" else x
        if which == "entropy":
            only = dict(x, grad_logps=torch.zeros_like(x["grad_logps"]))
        want = _dense(only)
        weight = torch.nn.Parameter(distribute_tensor(x["weight"].clone(), mesh, [Shard(0)]))
        bias = torch.nn.Parameter(distribute_tensor(x["bias"].clone(), mesh, [Shard(0)]))
        hidden = distribute_tensor(x["hidden"].clone(), mesh, [Replicate()]).requires_grad_()
        if which == "logps":
            value = vocab_parallel_token_logps(hidden, weight, x["targets"], bias=bias, chunks=3)
            (x["grad_logps"] * value).sum().backward()
        else:
            value = vocab_parallel_entropy(hidden, weight, bias=bias, chunks=3, mask=x["targets"] != IGNORE)
            (x["grad_entropy"] * value).sum().backward()
        out[which] = _error(value, want[which])
        out[f"{which}_hidden"] = _error(hidden.grad.full_tensor(), want["hidden"])
        out[f"{which}_weight"] = _error(weight.grad.full_tensor(), want["weight"])
        out[f"{which}_bias"] = _error(bias.grad.full_tensor(), want["bias"])
    return out


def _logit_shards(rank, world) -> dict[str, float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from ditty.stages.vocab_parallel_logps import logit_shard_logps

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    x = _inputs(torch.float64)
    full = torch.nn.functional.linear(x["hidden"], x["weight"]).reshape(1, TOKENS, VOCAB)
    logits = distribute_tensor(full.clone(), mesh, [Shard(2)]).requires_grad_()
    logps, entropy = logit_shard_logps(logits, x["targets"].reshape(1, -1), temperature=0.5, entropy=True)
    (x["grad_logps"] * logps[0] + x["grad_entropy"] * entropy[0]).sum().backward()
    dense = full.clone().requires_grad_()
    logp = torch.log_softmax(dense / 0.5, dim=-1)[0]
    keep = x["targets"] != IGNORE
    want_logps = torch.where(keep, logp.gather(1, x["targets"].clamp(min=0)[:, None]).squeeze(1), 0.0)
    want_entropy = torch.where(keep, -(logp.exp() * logp).sum(-1), 0.0)
    (x["grad_logps"] * want_logps + x["grad_entropy"] * want_entropy).sum().backward()
    return {
        "logps": _error(logps[0], want_logps),
        "entropy": _error(entropy[0], want_entropy),
        "logits": _error(logits.grad.full_tensor(), dense.grad),
    }


def _nothing_to_score(rank, world) -> dict[str, float]:
    """Every row masked, and no rows at all: zeros, zero gradients that still reach the weight."""
    import torch.distributed as dist

    from ditty.stages.vocab_parallel_logps import vocab_parallel_logps_and_entropy

    x = _inputs(torch.float64)
    weight, start = _shard(x["weight"], rank, world)
    out = {}
    for name, hidden, targets in (
        ("all_masked", x["hidden"], torch.full((TOKENS,), IGNORE)),
        ("no_rows", x["hidden"][:0], x["targets"][:0]),
    ):
        w = weight.clone().requires_grad_()
        h = hidden.clone().requires_grad_()
        logps, entropy = vocab_parallel_logps_and_entropy(h, w, targets, dist.group.WORLD, vocab_start=start)
        (logps.sum() + entropy.sum()).backward()
        assert logps.shape == entropy.shape == targets.shape
        assert w.grad is not None and h.grad is not None
        out[name] = float(logps.abs().sum() + entropy.abs().sum() + w.grad.abs().sum() + h.grad.abs().sum())
    return out


def _group_inside_a_mesh(rank, world) -> dict[str, float]:
    """(dp 2, tp 2): each data rank scores its own tokens over its own tensor-parallel pair."""
    from torch.distributed.device_mesh import init_device_mesh

    from ditty.stages.vocab_parallel_logps import vocab_parallel_logps_and_entropy

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    x = _inputs(torch.float64, seed=10 + dp)
    want = _dense(x, softcap=5.0)
    weight, start = _shard(x["weight"], tp, 2)
    bias, _ = _shard(x["bias"], tp, 2)
    hidden, weight, bias = (t.clone().requires_grad_() for t in (x["hidden"], weight, bias))
    logps, entropy = vocab_parallel_logps_and_entropy(
        hidden, weight, x["targets"], mesh["tp"].get_group(), bias=bias, vocab_start=start, softcap=5.0, chunks=2
    )
    (x["grad_logps"] * logps + x["grad_entropy"] * entropy).sum().backward()
    rows = slice(start, start + weight.shape[0])
    return {
        "logps": _error(logps, want["logps"]),
        "entropy": _error(entropy, want["entropy"]),
        "hidden": _error(hidden.grad, want["hidden"]),
        "weight": _error(weight.grad, want["weight"][rows]),
    }


def _tiny_llama(tied: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=tied,
        attention_dropout=0.0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).double()


def _model_under_tensor_parallel(rank, world) -> dict[str, float]:
    """ditty's tensor-parallel plan on a tiny Llama (tp = world): `sharded_token_logps` on the head's
    input and vocabulary-sharded projection equals `token_logps` of the same model whole, in values
    and in every parameter's gradient."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from ditty.objectives.logprobs import sampling_projection, token_logps
    from ditty.parallel.tensor import apply_tensor_parallel
    from ditty.stages.fused_loss import emit_head_input, head_projection, output_head
    from ditty.stages.vocab_parallel import tensor_parallel_rows
    from ditty.stages.vocab_parallel_logps import sharded_token_logps

    g = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, VOCAB, (3, 12), generator=g)
    labels = input_ids.clone()
    labels[:, :4] = IGNORE  # prompts
    labels[2, 9:] = IGNORE  # padding
    upstream = torch.randn(3, 12, generator=g, dtype=torch.float64)
    out = {}
    for tied in (False, True):
        dense = _tiny_llama(tied)
        sharded = copy.deepcopy(dense)
        dense.train()
        with emit_head_input(dense) as head:
            dense(input_ids=input_ids, use_cache=False)
        projection = sampling_projection(head_projection(output_head(dense), dense.config), 0.8)
        want, want_scored = token_logps(head.hidden, projection, labels, chunks=3)
        (upstream * want).sum().backward()

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        apply_tensor_parallel(sharded, mesh)
        sharded.train()
        assert (sharded.lm_head.weight is sharded.model.embed_tokens.weight) == tied
        with emit_head_input(sharded) as head:
            sharded(input_ids=input_ids, use_cache=False)
        projection = head_projection(output_head(sharded), sharded.config, keep_vocab_shards=True)
        assert tensor_parallel_rows(projection.weight)
        got, scored = sharded_token_logps(head.hidden, sampling_projection(projection, 0.8), labels, chunks=3)
        (upstream * got).sum().backward()
        assert torch.equal(scored, want_scored)
        name = "tied" if tied else "untied"
        out[f"{name}_logps"] = _error(got, want)
        grads = {n: p.grad for n, p in dense.named_parameters()}
        worst = 0.0
        for n, p in sharded.named_parameters():
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            worst = max(worst, _error(grad, grads[n]))
        out[f"{name}_grads"] = worst
        out[f"{name}_parameters"] = float(len(list(sharded.parameters())) == len(list(dense.parameters())))
    return out


def _everything(rank: int, world: int) -> dict[str, dict[str, float]]:
    results = {
        "float64": _plain_shards(rank, world, torch.float64, temperature=0.7, softcap=30.0),
        "float64-one-chunk": _plain_shards(rank, world, torch.float64, chunks=1),
        "float32": _plain_shards(rank, world, torch.float32, temperature=1.3),
        "dtensor": _separate_calls(rank, world),
        "logit-shards": _logit_shards(rank, world),
        "empty": _nothing_to_score(rank, world),
    }
    if world == 4:
        results["dp2-tp2"] = _group_inside_a_mesh(rank, world)
    if world > 1:
        results["model"] = _model_under_tensor_parallel(rank, world)
    return results


@pytest.fixture(scope="module")
def results():
    return {world: run_ranks(_everything, world, timeout=300) for world in (1, 2, 4)}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_logps_entropy_and_gradients_match_dense_log_softmax(results, world):
    for rank, found in enumerate(results[world]):
        for case in ("float64", "float64-one-chunk", "dtensor", "logit-shards"):
            worst = max(found[case].values())
            print(f"tp {world} rank {rank} {case}: worst relative difference {worst:.1e}")
            assert worst < EXACT, (case, found[case])
        float32 = {k: v for k, v in found["float32"].items() if not k.startswith("masked")}
        print(f"tp {world} rank {rank} float32: worst {max(float32.values()):.1e}")
        assert max(float32.values()) < FLOAT32, found["float32"]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_masked_rows_score_zero_and_pass_no_gradient(results, world):
    for found in results[world]:
        for case in ("float64", "float32"):
            assert found[case]["masked"] == 0.0 and found[case]["masked_grad"] == 0.0
        assert found["empty"] == {"all_masked": 0.0, "no_rows": 0.0}


def test_a_tensor_parallel_group_inside_a_data_parallel_mesh(results):
    for found in results[4]:
        assert max(found["dp2-tp2"].values()) < EXACT, found["dp2-tp2"]


@pytest.mark.parametrize("world", [2, 4])
def test_a_model_under_ditty_tensor_parallel_matches_token_logps_of_the_whole_model(results, world):
    for rank, found in enumerate(results[world]):
        model = found["model"]
        print(f"tp {world} rank {rank}: {model}")
        for name in ("untied", "tied"):
            assert model[f"{name}_parameters"] == 1.0  # the tied head stays one parameter
            assert model[f"{name}_logps"] < EXACT and model[f"{name}_grads"] < EXACT, model
