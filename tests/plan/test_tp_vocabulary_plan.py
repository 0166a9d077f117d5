"""The memory planner under tensor parallel with a vocabulary tp does not divide (each rank's own
torch.chunk piece of the embedding and the head) and with a head tied to the embedding (one matrix,
held by FSDP's root unit from the forward to the backward, as an untied head is)."""

from __future__ import annotations

from ditty.config import TrainerConfig
from ditty.config.sections import DataConfig, ModelConfig, ParallelConfig, RunConfig, TokenizerConfig, TrainConfig
from ditty.plan import Target, make_plan
from ditty.plan.memory import local_parameter_bytes

SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def recipe(*, tied: bool = False, device: str = "cpu") -> TrainerConfig:
    return TrainerConfig(
        run=RunConfig(device=device),
        model=ModelConfig(architecture="llama", init="random", config={**SIZES, "tie_word_embeddings": tied}),
        tokenizer=TokenizerConfig(kind="byte"),  # 259 tokens
        data=DataConfig(source="builtin", name="addition", format="prompt_completion", max_seq_len=32),
        train=TrainConfig(steps=4, global_batch_size=8, micro_batch_size=2),
        parallel=ParallelConfig(kind="fsdp", tp=2),
    )


def test_each_rank_holds_its_own_piece_of_an_uneven_vocabulary():
    plan = make_plan(recipe(), Target(device="cpu", gpus_per_node=4), with_knobs=False)
    held = {rank: local_parameter_bytes(plan.memory.held, plan.settings, rank) for rank in range(4)}
    # ranks (dp, tp): 259 rows are 130 + 129 over tp, then FSDP halves each: 65, 65, 65 and 64 rows of
    # the embedding and of the head (64 fp32 values a row)
    assert held[0] == held[1] == held[2] == held[3] + 2 * 64 * 4


def test_a_tied_head_is_gathered_with_the_root_like_an_untied_one():
    def gathered(tied: bool) -> int:
        target = Target(device="cuda", gpus_per_node=8, nodes=1, memory=80 * 2**30, gpu="H100")
        plan = make_plan(recipe(tied=tied, device="cuda"), target, with_knobs=False)
        rows = [row for row in plan.memory.kinds[0].rows if row.label == "FSDP gathered parameters"]
        return rows[0].bytes

    # untied: the head (its own unit, kept from forward to backward) and the root's norm; tied: the
    # shared matrix, in the root, and the norm. The same bytes.
    assert gathered(tied=True) == gathered(tied=False) > 0
