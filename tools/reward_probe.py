"""Where a reward model on the built-in addition pairs goes wrong, and what its layers hold.

    python tools/reward_probe.py runs/tiny_reward/final            # pair accuracy by kind of wrong sum
    python tools/reward_probe.py runs/tiny_sft/final --layers      # + linear probes, layer by layer

The first table scores the 428 held-out pairs of `tiny_reward` (data.num_samples 20000,
val_fraction 0.05) through transformers alone, as tests/reward/test_tiny_reward.py does, and splits
them by how the rejected sum is wrong: off by one (+1, -1), off by ten (+10, -10) or digits swapped.

`--layers` loads the checkpoint's base model (a causal LM's or a sequence classifier's) and fits a
linear probe (a 10-way logistic regression, 300 Adam steps on 4,000 training problems) to the
hidden state after each layer, at the EOS and at one and two positions before it, of texts that
end in the WRONG sum. Per cell it prints the held-out accuracy of reading the correct units digit
((a0 + b0) mod 10, what checking an off-by-one sum needs) and the written one. A reward model reads
its score at the EOS, whose last layer sees only the previous layer's states of other positions.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

NUM_SAMPLES, VAL_FRACTION = 20000, 0.05


def problems():
    from ditty.data.builtin import generate_problems, split_problems

    train, held_out = split_problems(generate_problems("addition", NUM_SAMPLES), VAL_FRACTION)
    return list(dict(train).items()), held_out


def kind_of_error(answer: str, wrong: str) -> str:
    return {1: "+1", -1: "-1", 10: "+10", -10: "-10"}.get(int(wrong) - int(answer), "swap")


def encode(tokenizer, texts: list[str]) -> dict:
    """Each text + EOS, right-padded with the pad id: the rows ditty scores."""
    rows = [tokenizer(text)["input_ids"] + [tokenizer.eos_token_id] for text in texts]
    width = max(len(row) for row in rows)
    return {
        "input_ids": torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]),
        "attention_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows]),
    }


def accuracy_by_kind(path: str) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ditty.data.builtin import wrong_answer

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    _, held_out = problems()
    right = collections.defaultdict(list)
    with torch.no_grad():
        for prompt, answer in held_out:
            wrong = wrong_answer(prompt, answer)
            chosen, rejected = model(**encode(tokenizer, [prompt + answer, prompt + wrong])).logits[:, 0]
            right[kind_of_error(answer, wrong)].append(float(chosen > rejected))
    total = sum(map(sum, right.values())) / sum(map(len, right.values()))
    print(f"held-out pair accuracy {total:.3f} ({len(held_out)} pairs)")
    for kind in ("+1", "-1", "+10", "-10", "swap"):
        print(f"  {kind:>4}: {sum(right[kind]):.0f}/{len(right[kind])} = {sum(right[kind]) / len(right[kind]):.2f}")


def states(model, tokenizer, items) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """{(layer, positions before the EOS): [N, hidden]}, correct units digits, written units digits."""
    from ditty.data.builtin import wrong_answer

    texts = [prompt + wrong_answer(prompt, answer) for prompt, answer in items]
    batch = encode(tokenizer, texts)
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
    eos = batch["attention_mask"].sum(1) - 1
    rows = torch.arange(len(texts))
    by_cell = {(layer, back): hidden[layer][rows, eos - back] for layer in range(len(hidden)) for back in (0, 1, 2)}
    correct = torch.tensor([int(answer[-1]) for _, answer in items])
    written = torch.tensor([int(text[-1]) for text in texts])
    return by_cell, correct, written


def probe(train_x, train_y, test_x, test_y) -> float:
    mean, std = train_x.mean(0), train_x.std(0) + 1e-5
    linear = torch.nn.Linear(train_x.shape[1], 10)
    optimizer = torch.optim.Adam(linear.parameters(), lr=1e-2)
    for _ in range(300):
        loss = torch.nn.functional.cross_entropy(linear((train_x - mean) / std), train_y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (linear((test_x - mean) / std).argmax(1) == test_y).float().mean().item()


def layer_probes(path: str) -> None:
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModel.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    train, held_out = problems()
    train_cells, train_correct, train_written = states(model, tokenizer, train[:4000])
    test_cells, test_correct, test_written = states(model, tokenizer, held_out)
    print("layer  position    correct units digit  written units digit")
    for layer, back in sorted(train_cells):
        where = "EOS" if back == 0 else f"EOS-{back}"
        correct = probe(train_cells[layer, back], train_correct, test_cells[layer, back], test_correct)
        written = probe(train_cells[layer, back], train_written, test_cells[layer, back], test_written)
        print(f"{layer:>5}  {where:<10}  {correct:>19.3f}  {written:>19.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a final/ directory (a reward model's, or the causal LM it started from)")
    parser.add_argument("--layers", action="store_true", help="also print the layer-by-layer linear probes")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.path, "config.json")):
        # An adapter run's final/ holds the adapter alone; its merged model is final/merged.
        print(
            f"{args.path} has no config.json: give a full model's directory (final/merged for an adapter run)",
            file=sys.stderr,
        )
        sys.exit(2)
    from transformers import AutoConfig

    if AutoConfig.from_pretrained(args.path).num_labels == 1:
        accuracy_by_kind(args.path)
    if args.layers:
        layer_probes(args.path)


if __name__ == "__main__":
    main()
