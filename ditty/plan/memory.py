"""The per-rank memory plan: rows and totals for each kind of rank.

Rows, in order: parameters by kind (frozen, trainable, 4-bit packed, adapters), the 4-bit
quantization state, gradients, optimizer state (and DeepSpeed's fp32 master weights), activations
of one micro-batch, the logits and loss, transient buffers of the parallel engine (FSDP's
gathered blocks, DDP's buckets, DeepSpeed's buckets) and of 4-bit dequantization, and the
framework's fixed overhead. Ranks whose rows are equal form one kind (FSDP's uneven shards make
the first ranks hold a few rows more); rank 0 also differs while the model loads when it alone
reads (and quantizes) the checkpoint. What CPU offload moves out is listed as host memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ditty.plan.activations import Activations, LossMemory, plan_activations, plan_loss
from ditty.plan.architecture import ModelShape
from ditty.plan.mtp import heads_activation_bytes
from ditty.plan.parameters import HeldTensor, StateBytes, held_tensors, local_numel, rank_state
from ditty.plan.settings import DTYPE_BYTES, SHARDED, GiB, Settings
from ditty.plan.tensor_parallel import tp_local

# Device memory a process holds before any tensor: the CUDA context with PyTorch's kernels and
# the cuBLAS/cuDNN workspaces; NCCL's communication buffers when there are several processes.
CUDA_CONTEXT = int(0.8 * GiB)
NCCL_BUFFERS = int(0.5 * GiB)
# A CPU process's resident memory before the model: the interpreter with torch, transformers,
# datasets and the tokenizer imported, as `ditty run` holds them, and what peft's import adds
# (BENCHMARKS.md, "Planner"). The libraries' share depends on how their files sit in the page
# cache: the same tiny run peaked at 508 MiB from a long-installed environment and 653 MiB right
# after `pip install` (the kernel maps more of a freshly written file per page fault). The
# baseline sits between the two, so either is within 15%.
CPU_PROCESS_BASELINE = 570 * 2**20
CPU_PEFT_IMPORT = 50 * 2**20
# torchao's 8-bit AdamW compiles its update with torch.compile: the compiler stays in memory.
CPU_TORCH_COMPILE = 110 * 2**20
# DeepSpeed's defaults: reduce and all-gather buckets of 5e8 elements; with overlap_comm (which
# ditty sets) its documentation puts the buffers at 4.5 times the bucket sizes.
DEEPSPEED_BUCKET = 500_000_000


@dataclass(frozen=True)
class Row:
    label: str
    bytes: int
    note: str = ""
    kind: str = "state"
    """"state" (parameters, gradients, optimizer), "activations", "transient", "overhead"."""


@dataclass
class RankKind:
    ranks: list[int]
    rows: list[Row]
    host_rows: list[Row] = field(default_factory=list)
    load_bytes: int = 0
    """Device bytes while the model is built and loaded, before training starts."""
    load_note: str = ""
    state: Optional[StateBytes] = None

    @property
    def total(self) -> int:
        return sum(row.bytes for row in self.rows)

    @property
    def peak(self) -> int:
        return max(self.total, self.load_bytes)

    def describe_ranks(self) -> str:
        r = self.ranks
        if len(r) == 1:
            return f"rank {r[0]}"
        if r == list(range(r[0], r[-1] + 1)):
            return f"ranks {r[0]}-{r[-1]}"
        return "ranks " + ",".join(str(x) for x in r)


@dataclass
class MemoryPlan:
    kinds: list[RankKind]
    held: list[HeldTensor]

    @property
    def peak(self) -> int:
        return max(kind.peak for kind in self.kinds)

    def for_rank(self, rank: int) -> RankKind:
        return next(kind for kind in self.kinds if rank in kind.ranks)


def plan_memory(shape: ModelShape, s: Settings, *, activation_checkpointing: Optional[str] = None) -> MemoryPlan:
    from ditty.plan.objective import objective_rows  # it builds this module's Rows

    held = held_tensors(shape, s)
    activations = plan_activations(shape, s, held, activation_checkpointing)
    head_trains = s.peft == "none" or "lm_head" in s.modules_to_save
    loss = plan_loss(shape, s, head_trains=head_trains)
    checkpointing = activation_checkpointing or s.activation_checkpointing
    shared_rows = [
        Row(
            f"activations ({s.micro_batch} x {s.seq_len} tokens"
            + (f" / cp {s.cp}" if s.cp > 1 else "")
            + (f", tp {s.tp}" if s.tp > 1 else "")
            + f", checkpointing {checkpointing})",
            activations.total,
            activations.detail,
            "activations",
        ),
        Row("logits and loss", loss.bytes, loss.detail, "activations"),
    ]
    heads = heads_activation_bytes(shape, activations.kept_per_block, activations.tokens, DTYPE_BYTES[s.weight_dtype])
    if heads:
        depth = shape.extra["mtp_depth"]
        shared_rows.append(Row(f"MTP heads' activations ({depth} blocks)", heads, "ditty.plan.mtp", "activations"))
    shared_rows += _transients(shape, s, held)
    if s.device == "cpu":
        shared_rows += _cpu_rows(shape, s, held, activations, loss)
    overhead, overhead_note = _overhead(s)
    kinds: list[RankKind] = []
    by_rows: dict[tuple, RankKind] = {}
    for rank in range(s.world_size):
        state = rank_state(held, s, rank)
        device_rows, host_rows = _state_rows(state, s)
        rows = device_rows + objective_rows(shape, s, held, rank) if s.objective is not None else device_rows
        rows = rows + shared_rows + [Row("framework fixed overhead", overhead, overhead_note, "overhead")]
        if s.accumulation == 1 and s.parallel != "deepspeed" and state.gradients:
            # One micro-batch per step and gradients set to None after it: the backward creates
            # them as it frees the activations, so the two never peak together.
            freed = sum(r.bytes for r in shared_rows if r.kind == "activations")
            overlap = min(state.gradients, freed)
            rows.append(Row("gradients made as activations are freed", -overlap, "accumulation 1", "overlap"))
        load, load_note = _load_phase(held, s, rank, state)
        key = (tuple(rows), tuple(host_rows), load)
        if key in by_rows:
            by_rows[key].ranks.append(rank)
            continue
        kind = RankKind([rank], rows, host_rows, load + overhead, load_note, state)
        by_rows[key] = kind
        kinds.append(kind)
    return MemoryPlan(kinds, held)


def _overhead(s: Settings) -> tuple[int, str]:
    if s.device == "cpu":
        peft = CPU_PEFT_IMPORT if s.peft != "none" else 0
        compiler = CPU_TORCH_COMPILE if s.optimizer == "adamw8bit" and s.optimizer_backend == "torchao" else 0
        return CPU_PROCESS_BASELINE + peft + compiler, "interpreter and libraries (resident memory of a CPU process)"
    nccl = NCCL_BUFFERS if s.world_size > 1 else 0
    return CUDA_CONTEXT + nccl, "CUDA context and kernels" + (", NCCL buffers" if nccl else "")


def _cpu_rows(
    shape: ModelShape, s: Settings, held: list[HeldTensor], activations: Activations, loss: LossMemory
) -> list[Row]:
    """What a CPU process holds beyond its tensors. glibc's heap keeps the memory a step frees: the
    activations of the next step do not fit the holes the last one left, so the heap holds about
    one more step of them. Only the tensors it serves from its heap, though: those below its mmap
    threshold, which glibc raises up to 32 MB after the first large free, and which the trainer
    fixes at 2 MB where freed memory should go back (multi-process FSDP; any CPU run under
    DITTY_CPU_ALLOCATOR=return in this environment; see ditty.parallel.allocator). Larger tensors
    are mapped and unmapped, and leave nothing behind (tools/plan_validate.py: a packed row of
    16,384 tokens, whose 64 MB MLP tensors are mapped, within 5% of the plan).
    And a checkpoint loaded quantized stays memory-mapped: its pages, read to quantize, stay resident."""
    from ditty.parallel.allocator import heap_mmap_threshold

    rows = []
    threshold = heap_mmap_threshold("cpu", s.parallel, s.world_size)
    kept = activations.in_tensors_below(threshold) + (loss.bytes if loss.tensor_bytes < threshold else 0)
    if kept:
        note = f"glibc keeps freed activations below {threshold // 2**20} MB"
        rows.append(Row("CPU heap kept from the previous step", kept, note, "transient"))
    if s.quant != "none":
        quantized = [t for t in held if t.group in ("4-bit weights", "8-bit weights")]
        stored = shape.checkpoint_dtype if shape.checkpoint_dtype in DTYPE_BYTES else s.weight_dtype
        mapped = sum(t.numel for t in quantized) * DTYPE_BYTES[stored]
        rows.append(Row("checkpoint pages kept mapped", mapped, "the quantized weights as stored on disk", "transient"))
    return rows


def _state_rows(state: StateBytes, s: Settings) -> tuple[list[Row], list[Row]]:
    rows = [Row(label, size, "", "state") for label, size in state.parameters.items() if size]
    if state.quant_states:
        rows.append(Row("4-bit quantization state", state.quant_states, "absmax and code books, on every rank"))
    if state.gradients:
        rows.append(Row("gradients", state.gradients, "trainable parameters"))
    if state.master_weights:
        rows.append(Row("fp32 master weights", state.master_weights, "DeepSpeed's partition"))
    if state.optimizer:
        rows.append(Row("optimizer state", state.optimizer, state.optimizer_label))
    host: list[Row] = []
    if s.cpu_offload:  # FSDP2 CPU offload: sharded parameters, gradients and optimizer state
        host, rows = [r for r in rows if r.kind == "state"], [r for r in rows if r.kind != "state"]
    elif s.offload_optimizer or s.offload_params:
        moved = {"optimizer state", "fp32 master weights"}
        if s.offload_params:
            moved |= {label for label in state.parameters}
        host = [r for r in rows if r.label in moved or (r.label == "gradients")]
        rows = [r for r in rows if r not in host]
        # The 16-bit gradients of the partition stay on the device until they are copied out.
    return rows, host


def _transients(shape: ModelShape, s: Settings, held: list[HeldTensor]) -> list[Row]:
    rows: list[Row] = []
    if s.parallel in SHARDED and s.shard_size > 1:
        rows.append(_fsdp_gathered(shape, s, held))
    if s.parallel == "ddp" and s.world_size > 1 and not s.gradient_as_bucket_view:
        grads = sum(t.bytes for t in held if t.trainable)
        rows.append(
            Row(
                "DDP gradient buckets", grads, "a copy of every gradient (gradient_as_bucket_view = false)", "transient"
            )
        )
    if s.parallel == "deepspeed" and s.world_size > 1:
        trainable = sum(t.numel for t in held if t.trainable)
        size = DTYPE_BYTES[s.weight_dtype]
        buffers = int(4.5 * min(DEEPSPEED_BUCKET, trainable) * size)
        rows.append(Row("DeepSpeed buckets", buffers, "overlap_comm: 4.5 x the reduce/all-gather bucket", "transient"))
        if s.zero_stage == 3:
            block = _block_bytes(held, s.weight_dtype)
            rows.append(
                Row("ZeRO-3 gathered parameters", 2 * block, "the running and the prefetched block", "transient")
            )
    if s.quant == "bnb-4bit":
        largest = max((t.numel for t in held if t.group == "4-bit weights"), default=0)
        dtype = s.compute_dtype or s.weight_dtype
        rows.append(
            Row(
                "4-bit dequantization",
                2 * largest * DTYPE_BYTES[dtype],
                "the largest weight dequantized, forward and backward",
                "transient",
            )
        )
    return rows


def _fsdp_gathered(shape: ModelShape, s: Settings, held: list[HeldTensor]) -> Row:
    """Unsharded parameters (and, in the backward, their unsharded gradients) of the units FSDP2 is
    running: the current and the prefetched block; every block when reshard_after_forward is off;
    the output head from its forward to its backward; the root (final norm, tied embeddings)."""
    gather = s.gather_dtype

    def gathered(tensors: list[HeldTensor]) -> int:
        """Bytes of the tensors gathered whole over FSDP2's ranks: a tensor-parallel rank's piece of each."""
        return sum(
            _tp_numel(t, s.tp) * DTYPE_BYTES[gather]
            if t.dtype not in ("uint8", "int8") and t.group != "4-bit weights"
            else t.bytes
            for t in tensors
        )

    by_block: dict[int, list[HeldTensor]] = {}
    for tensor in held:
        if tensor.block is not None:
            by_block.setdefault(tensor.block, []).append(tensor)
    blocks = [gathered(tensors) for tensors in by_block.values()]
    largest = max(blocks, default=0)
    trainable = max(
        (sum(_tp_numel(t, s.tp) for t in tensors if t.trainable) for tensors in by_block.values()), default=0
    )
    grad_bytes = DTYPE_BYTES[gather] + (4 if DTYPE_BYTES[gather] != 4 else 0)  # reduce-scatter in fp32
    resident = sum(blocks) if s.reshard_after_forward is False else 2 * largest
    # An untied embedding is a unit of its own, resharded after its lookup; a tied one is the head,
    # kept by the root from the forward to the backward.
    outside = gathered(
        [
            t
            for t in held
            if t.block is None and (shape.tie_word_embeddings or not t.name.startswith("model.embed_tokens"))
        ]
    )
    total = resident + 2 * trainable * grad_bytes + outside
    note = "every block (reshard_after_forward = false)" if s.reshard_after_forward is False else "2 blocks"
    return Row("FSDP gathered parameters", total, f"{note}, the head and root, 2 blocks' gradients", "transient")


def _tp_numel(tensor: HeldTensor, tp: int) -> int:
    rows, per_row = tp_local(tensor.name, tensor.rows, tensor.numel // max(tensor.rows, 1), tp)
    return rows * per_row


def _block_bytes(held: list[HeldTensor], dtype: str) -> int:
    """Bytes of the largest block in `dtype`."""
    sizes: dict[int, int] = {}
    for tensor in held:
        if tensor.block is not None:
            sizes[tensor.block] = sizes.get(tensor.block, 0) + tensor.numel * DTYPE_BYTES[dtype]
    return max(sizes.values(), default=0)


def _load_phase(held: list[HeldTensor], s: Settings, rank: int, state: StateBytes) -> tuple[int, str]:
    """Device bytes while building: the whole model on every rank unless the low-memory load
    applies (rank 0 streams a full finetune's checkpoint tensor by tensor, or loads and quantizes a
    QLoRA base whole while the others build on the meta device)."""
    if s.parallel not in SHARDED or s.shard_size <= 1:
        return 0, ""
    whole = sum(t.bytes for t in held)
    if not s.low_memory_load:
        return whole, "every rank builds the whole model, then keeps its shard"
    if s.quant != "none":
        if rank == 0:
            return whole + sum(t.quant_state_bytes for t in held), "rank 0 loads and quantizes the whole base"
        return state.parameter_total, "built on the meta device; rank 0 sends the shard"
    largest = max((t.bytes for t in held), default=0)
    return state.parameter_total + (largest if rank == 0 else 0), "rank 0 streams the checkpoint tensor by tensor"


def local_parameter_bytes(held: list[HeldTensor], s: Settings, rank: int) -> int:
    """What `ditty.parallel.memory.parameter_bytes` measures on `rank` (for tests and reports)."""
    return sum(local_numel(t, s, rank) * DTYPE_BYTES[t.dtype] for t in held)
