"""ditty's preference (DPO) and RL (GRPO) training against TRL's DPOTrainer and GRPOTrainer on the CPU
(tools/bench.py sections "dpo" and "grpo", only when named with --only; never in --quick).

    python tools/bench.py --only dpo,grpo [--reps 3]

Both sides train the same model, saved once with save_pretrained into a temporary directory and
loaded from there by both: tiny_sft's Llama (4 layers, 128 wide, 4 heads, byte vocabulary of 259,
seed 0, random init) with ditty's byte tokenizer. Full finetuning (no LoRA: the simplest setting both
run identically), fp32, AdamW (torch's fused kernel on both sides, lr 1e-5, no weight decay),
clipping at 1.0, constant learning rate, no evaluation, no checkpoints, one torch thread per process;
every run is its own subprocess and the contenders alternate (ditty, TRL, ditty, TRL, ...).

- dpo: 16 pairs per step of the built-in addition problems (prompt "12+47=", chosen the sum, rejected
  ditty's `wrong_answer`; the completions end with EOS), max length 32, plain sigmoid DPO with beta
  0.1 and the reference a frozen copy of the starting weights (ditty `reference = "auto"`, TRL
  `ref_model=None`), both computed every step. Figure: pairs per CPU-second.
- grpo: 8 prompts x 8 completions per step (64 completions), at most 4 new tokens, temperature 1,
  top_p 1, top_k off, the DAPO loss, beta 0 (no reference), rewards group-scaled, one update per
  rollout, the same reward on both sides (a hash of the completion text: every group has spread, so
  both sides train every row; exact match on a random model would reward nothing).
  Figures: completions per CPU-second and the share of the step's CPU time spent in `generate`.
  Where vllm imports (`make setup-vllm`), a third contender: ditty with rl.backend = "vllm" (the
  engine in the training process; its start is part of the build, before the timed steps), whose
  generation share is the CPU time inside its sampler (the engine's sampling and weight reloads).

How it is measured, the same on both sides: a global torch optimizer-step post-hook stamps process
(CPU) and wall time after every optimizer step; the figure is over the steps after the warm-up ones
(from the stamp of the last warm-up step to the last stamp), so it includes everything a step does
(data, generation, rewards, reference and policy forwards, backward, clipping, optimizer, metrics).
Generation time is the CPU time inside `transformers.GenerationMixin.generate`, wrapped in the worker
(with vLLM: inside VLLMSampler.sample and .load).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

TINY_LLAMA = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
LR, CLIP, SEED, MAX_LEN = 1e-5, 1.0, 0, 32
DPO_PAIRS, DPO_BETA = 16, 0.1
GRPO_PROMPTS, GROUP, MAX_NEW, TEMPERATURE = 8, 8, 4, 1.0
NUM_PROBLEMS = 2000  # problems drawn for the data (both sides tokenize them before training, untimed)
# A random model never answers a sum right, so exact match would give every completion reward 0 and
# advantage 0, which ditty skips (no gradient) and TRL trains: an unequal comparison. This reward
# differs between almost any two completions (a hash of the text), so both sides train every row.
REWARD = "bench_post:completion_hash_reward"


def completion_hash_reward(prompts, completions, **columns) -> list[float]:
    """A deterministic reward in [0, 1) that differs between completions: for timing, not learning."""
    import zlib

    return [zlib.crc32(str(c).encode()) % 1000 / 1000 for c in completions]


# ============================================================================ shared pieces (in workers)


def model_dir(tmp: Path) -> str:
    """The tiny Llama and the byte tokenizer saved in Hugging Face format, once per benchmark run."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ditty.data.tokenizer import byte_tokenizer

    path = tmp / "tiny-llama"
    if not (path / "config.json").exists():
        tokenizer = byte_tokenizer()
        config = LlamaConfig(
            **TINY_LLAMA,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        torch.manual_seed(SEED)
        LlamaForCausalLM(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


class StepClock:
    """Process and wall time after every optimizer step (a global torch hook: whoever builds the
    optimizer), and the CPU time spent inside `generate` so far at each stamp."""

    def __init__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from transformers.generation.utils import GenerationMixin

        self.stamps: list[tuple[float, float, float]] = []
        self.generate_cpu = 0.0
        self.shapes: list[tuple[int, int, int]] = []  # (rows, padded tokens, real tokens) of training forwards
        register_optimizer_step_post_hook(self.stamp)
        original = GenerationMixin.generate

        def timed_generate(model, *args, **kwargs):
            start = time.process_time()
            try:
                return original(model, *args, **kwargs)
            finally:
                self.generate_cpu += time.process_time() - start

        GenerationMixin.generate = timed_generate
        try:
            from ditty.objectives.sampling.vllm_sampler import VLLMSampler
        except ImportError:
            return
        for name in ("sample", "load"):
            setattr(VLLMSampler, name, self.timed(getattr(VLLMSampler, name)))

    def timed(self, function):
        def timed_function(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.generate_cpu += time.process_time() - start

        return timed_function

    def watch(self, model) -> None:
        """Count the rows and tokens of the policy's training (grad-enabled) forwards: the work done."""
        import torch

        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            if torch.is_grad_enabled() and ids is not None:
                real = int(mask.sum()) if mask is not None and mask.dim() == 2 else ids.numel()
                self.shapes.append((ids.shape[0], ids.numel(), real))

        model.register_forward_pre_hook(hook, with_kwargs=True)

    def stamp(self, optimizer, args, kwargs):
        self.stamps.append((time.perf_counter(), time.process_time(), self.generate_cpu))

    def result(self, warmup: int, items_per_step: int) -> dict:
        s = self.stamps
        if len(s) < warmup + 1:
            raise RuntimeError(f"only {len(s)} optimizer steps recorded, need {warmup} warm-up + 1")
        steps = len(s) - warmup
        first, last = s[warmup - 1], s[-1]
        wall, cpu, gen = last[0] - first[0], last[1] - first[1], last[2] - first[2]
        return {
            "steps": steps,
            "cpu_s": cpu,
            "wall_s": wall,
            "per_cpu_s": steps * items_per_step / cpu,
            "per_s": steps * items_per_step / wall,
            "generation_share": gen / cpu,
            "rows_per_forward": statistics.mean(r for r, _, _ in self.shapes),
            "padded_tokens_per_forward": statistics.mean(p for _, p, _ in self.shapes),
            "real_tokens_per_forward": statistics.mean(t for _, _, t in self.shapes),
            "forwards": len(self.shapes),
        }


def ditty_recipe(a: dict, data_format: str, batch: int, tail: str) -> str:
    from bench import bench_recipe

    tmp = Path(a["tmp"])
    data = f"""
[data]
source = "builtin"
name = "addition"
format = "{data_format}"
max_seq_len = {MAX_LEN}
num_samples = {NUM_PROBLEMS}
val_fraction = 0.0
"""
    return bench_recipe(
        name=a["name"],
        output_dir=tmp / a["name"],
        model=f'path = "{model_dir(tmp)}"',
        steps=a["steps"],
        batch=batch,
        lr=LR,
        clip=CLIP,
        seed=SEED,
        run="num_threads = 1",
        extra=data + tail,
    )


def run_ditty(a: dict, recipe: str, items_per_step: int) -> dict:
    from ditty.config.loader import parse_recipe
    from ditty.train.trainer import Trainer

    clock = StepClock()
    trainer = Trainer(parse_recipe(recipe).config)
    clock.watch(trainer.model)
    trainer.train()
    return clock.result(a["warmup"], items_per_step)


def trl_args(a: dict, config_class, **settings):
    return config_class(
        output_dir=str(Path(a["tmp"]) / a["name"]),
        max_steps=a["steps"],
        learning_rate=LR,
        weight_decay=0.0,
        max_grad_norm=CLIP,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch_fused",  # as ditty picks on the CPU (torch's fused AdamW kernel)
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        use_cpu=True,
        seed=SEED,
        bf16=False,
        fp16=False,
        **settings,
    )


def addition_problems() -> list[tuple[str, str]]:
    from ditty.data.builtin import generate_problems

    return generate_problems("addition", NUM_PROBLEMS)


# ============================================================================ workers


def worker_ditty_dpo(a: dict) -> dict:
    tail = f'[preference]\nkind = "dpo"\nbeta = {DPO_BETA}\nreference = "auto"\n'
    return run_ditty(a, ditty_recipe(a, "preference", DPO_PAIRS, tail), DPO_PAIRS)


def worker_trl_dpo(a: dict) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from ditty.data.builtin import wrong_answer

    path = model_dir(Path(a["tmp"]))
    rows = [dict(prompt=p, chosen=c, rejected=wrong_answer(p, c)) for p, c in addition_problems()]
    args = trl_args(
        a,
        DPOConfig,
        per_device_train_batch_size=DPO_PAIRS,
        max_length=MAX_LEN,
        beta=DPO_BETA,
        loss_type=["sigmoid"],
        precompute_ref_log_probs=False,
    )
    clock = StepClock()
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        ref_model=None,  # a frozen copy of the starting weights, as ditty's "auto" for a full finetune
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    clock.watch(trainer.model)
    trainer.train()
    return clock.result(a["warmup"], DPO_PAIRS)


def worker_ditty_grpo(a: dict, backend: str = "generate") -> dict:
    tail = (
        f'[rl]\nkind = "grpo"\ngroup_size = {GROUP}\nmax_new_tokens = {MAX_NEW}\ntemperature = {TEMPERATURE}\n'
        f'loss = "dapo"\nbeta = 0.0\nrewards = ["{REWARD}"]\nbackend = "{backend}"\n'
    )
    return run_ditty(a, ditty_recipe(a, "prompt", GRPO_PROMPTS * GROUP, tail), GRPO_PROMPTS * GROUP)


def worker_ditty_grpo_vllm(a: dict) -> dict:
    return worker_ditty_grpo(a, backend="vllm")


def worker_trl_grpo(a: dict) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    path = model_dir(Path(a["tmp"]))
    args = trl_args(
        a,
        GRPOConfig,
        per_device_train_batch_size=GRPO_PROMPTS * GROUP,  # completions per step, as ditty's global_batch_size
        num_generations=GROUP,
        max_completion_length=MAX_NEW,
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        loss_type="dapo",
        beta=0.0,
        scale_rewards="group",
        num_iterations=1,
        mask_truncated_completions=False,
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=[completion_hash_reward],
        args=args,
        train_dataset=Dataset.from_list([dict(prompt=p) for p, _ in addition_problems()]),
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    clock.watch(trainer.model)
    trainer.train()
    return clock.result(a["warmup"], GRPO_PROMPTS * GROUP)


WORKERS = {
    "post-ditty-dpo": worker_ditty_dpo,
    "post-trl-dpo": worker_trl_dpo,
    "post-ditty-grpo": worker_ditty_grpo,
    "post-ditty-grpo-vllm": worker_ditty_grpo_vllm,
    "post-trl-grpo": worker_trl_grpo,
}


# ============================================================================ the section (in tools/bench.py)

NOTES = {
    "dpo": (
        "dpo: work that differs: TRL's DPOTrainer also computes the per-token entropy, mean logit and top-1 "
        "accuracy over the vocabulary for its metrics and materialises full logits; ditty gathers the "
        "completion tokens' log-probabilities through the head in chunks. Both run the reference forward "
        "every step (no precomputation) and one forward of chosen and rejected together."
    ),
    "grpo": (
        "grpo: work that differs: TRL also computes the per-token entropy of the completions for its metrics "
        "(the logits of the completion positions only, as ditty); with beta 0 and one update per rollout "
        "neither side computes old or reference log-probabilities; both decode the completions for the reward. "
        "ditty leaves completions of advantage 0 out of the training forward and backward (their gradient is 0) "
        "and TRL does not, so the bench rewards each completion by a hash of its text: no group is all ties and "
        "both sides train every row. "
        "Generation share = CPU time inside transformers' generate / CPU time of the step, both sides."
    ),
}


def run_section(which: str, run_worker, base: dict, reps: int, timed: int, log) -> tuple[list[list[str]], list[str]]:
    """Rows (contender, figure per CPU-s, per wall-s, ratio to TRL, generation share, runs) and notes."""
    unit = "pairs" if which == "dpo" else "completions"
    contenders = {f"ditty Trainer ({which})": f"post-ditty-{which}", f"TRL {which.upper()}Trainer": f"post-trl-{which}"}
    notes = [NOTES[which]]
    if which == "grpo":
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:
            contenders["ditty Trainer (grpo, rl.backend vllm)"] = "post-ditty-grpo-vllm"
        else:
            notes.append(
                "grpo: no vLLM row: vllm is not installed here (`make setup-vllm`; run with .venv-vllm/bin/python)."
            )
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    steps = base["warmup"] + timed
    for rep in range(reps):
        for name, kind in contenders.items():
            r = run_worker(kind, dict(base, name=f"{kind}-{rep}", steps=steps), timeout=3600)
            log(
                f"  {name} rep {rep}: {r['per_cpu_s']:.1f} {unit}/CPU-s, {r['per_s']:.1f}/wall-s, "
                f"generation {r['generation_share']:.0%}; {r['forwards']} training forwards of "
                f"{r['rows_per_forward']:.0f} rows, {r['padded_tokens_per_forward']:.0f} tokens "
                f"({r['real_tokens_per_forward']:.0f} not padding)"
            )
            results[name].append(r)
    trl_name = f"TRL {which.upper()}Trainer"
    base_cpu = statistics.median(r["per_cpu_s"] for r in results[trl_name])
    base_wall = statistics.median(r["per_s"] for r in results[trl_name])
    rows = []
    for name, rs in results.items():
        cpu = statistics.median(r["per_cpu_s"] for r in rs)
        wall = statistics.median(r["per_s"] for r in rs)
        share = statistics.median(r["generation_share"] for r in rs)
        rows.append(
            [
                which,
                name,
                f"{cpu:,.1f} {unit}",
                f"{wall:,.1f}",
                f"{cpu / base_cpu:.2f}x",
                f"{wall / base_wall:.2f}x",
                f"{share:.0%}" if which == "grpo" else "-",
                f"{len(rs)} x {timed} steps",
            ]
        )
    return rows, notes


def render(rows: list[list[str]]) -> list[str]:
    out = [
        "| section | contender | per CPU-s (median) | per wall-s (median) | ratio to TRL (CPU) | ratio (wall) "
        "| generation share of step CPU | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return out + ["| " + " | ".join(r) + " |" for r in rows] + [""]
