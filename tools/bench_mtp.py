"""Draft acceptance and speculative speed-up of a run's MTP heads on the held-out addition problems.

    python tools/bench_mtp.py RUN_DIR [--samples N] [--max-new-tokens N] [--repeats R]

decodes every held-out problem of the built-in addition task (as `tiny_sft` splits it) greedily three
ways: transformers' `generate` (what `ditty generate` runs), ditty's one-token-per-forward loop, and the
same loop with the MTP heads' drafts (`ditty generate --speculative mtp`). It checks that the three give
the same tokens, and prints the drafts accepted, forwards of the model per token, and CPU-seconds per
problem (one torch thread, the best of `repeats` passes), with the speed-ups over both plain decoders.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from ditty.data.builtin import generate_problems, split_problems
from ditty.models.mtp.heads import build_heads
from ditty.models.mtp.speculative import greedy_decode
from ditty.models.mtp.weights import depth_saved, load_heads

NUM_SAMPLES, VAL_FRACTION = 20000, 0.05  # tiny_sft's [data]


def transformers_greedy(model, ids: list[int], max_new_tokens: int, eos: int) -> list[int]:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    out = model.generate(input_ids=torch.tensor([ids]), generation_config=config)
    return out[0, len(ids) :].tolist()


def timed(decode, prompts: list[list[int]], repeats: int) -> tuple[list, float]:
    """(outputs, best CPU-seconds over `repeats` passes of every prompt)."""
    best, outputs = float("inf"), []
    for _ in range(repeats):
        start = time.process_time()
        outputs = [decode(ids) for ids in prompts]
        best = min(best, time.process_time() - start)
    return outputs, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--samples", type=int, default=0, help="held-out problems to decode (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=4, help="as ditty's evaluation: the longest sum + EOS")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = os.path.join(args.run_dir, "final")
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    depth = depth_saved(final)
    if depth == 0:
        parser.error(f"{final} holds no MTP heads: train with [mtp] depth = 1 or more")
    heads = build_heads(model, depth)
    load_heads(heads, model, final)
    heads.eval()
    held_out = split_problems(generate_problems("addition", NUM_SAMPLES), VAL_FRACTION)[1]
    held_out = held_out[: args.samples] if args.samples else held_out
    prompts = [tokenizer(prompt)["input_ids"] for prompt, _ in held_out]
    eos, new = tokenizer.eos_token_id, args.max_new_tokens

    with torch.no_grad():
        reference, hf_s = timed(lambda ids: transformers_greedy(model, ids, new, eos), prompts, args.repeats)
        plain, plain_s = timed(lambda ids: greedy_decode(model, ids, new, eos), prompts, args.repeats)
        drafted, drafted_s = timed(lambda ids: greedy_decode(model, ids, new, eos, heads), prompts, args.repeats)
    same = sum(a == b[0] == c[0] for a, b, c in zip(reference, plain, drafted))
    tokens = sum(s.new_tokens for _, s in drafted)
    accepted, offered = sum(s.accepted for _, s in drafted), sum(s.drafted for _, s in drafted)
    forwards = {name: sum(s.model_forwards for _, s in out) for name, out in (("plain", plain), ("mtp", drafted))}
    correct = sum(tokenizer.decode(c[0], skip_special_tokens=True).strip() == a for c, (_, a) in zip(drafted, held_out))
    n = len(prompts)
    print(
        f"{final}: {depth} MTP head(s); {n} held-out problems, {tokens} tokens generated, exact match {correct / n:.3f}"
    )
    print(f"identical tokens (transformers generate, plain loop, drafted): {same} of {n}")
    print(f"drafts accepted: {accepted} of {offered} ({accepted / max(offered, 1):.3f})")
    plain_rate, drafted_rate = forwards["plain"] / tokens, forwards["mtp"] / tokens
    print(f"forwards of the model per token: plain {plain_rate:.3f}, drafted {drafted_rate:.3f}")
    print("| decoder | CPU-ms per problem | speed-up of drafting |")
    print("|---|---:|---:|")
    for name, seconds in (
        ("transformers generate", hf_s),
        ("ditty loop, no drafts", plain_s),
        ("ditty loop, MTP drafts", drafted_s),
    ):
        print(f"| {name} | {1000 * seconds / n:.2f} | {seconds / drafted_s:.2f}x |")


if __name__ == "__main__":
    main()
