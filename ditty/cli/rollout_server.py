"""`ditty rollout-server RECIPE [flags] [--print-command]`: the vLLM server a run with
`rollout.backend = "vllm-server"` samples from, started for that recipe.

It serves the recipe's starting model (`model.path`; the run sends its own weights before the first
sample and after every update) at the host and port of `rollout.vllm_server`, with what the run needs:
VLLM_SERVER_DEV_MODE=1 (the /collective_rpc endpoint the weights are reloaded through),
`--logprobs-mode processed_logprobs` (log-probabilities as sampled, after the temperature), a context of
data.max_seq_len + rollout.max_new_tokens, the run's seed, and on a CPU an eager engine with the KV cache one
step's rollouts need. It runs in the foreground until Ctrl-C; `--print-command` prints the command
instead (to run it elsewhere, or under a process manager).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import subprocess
import sys
from urllib.parse import urlparse

from ditty.cli.trust import TRUST_FLAG
from ditty.config import RecipeError

SERVED_NAME = "ditty-policy"


def cmd_rollout_server(args: list[str]) -> int:
    from ditty.cli.commands import _load, _recipe_and_flags
    from ditty.cli.options import take_option
    from ditty.cli.usage import print_warnings
    from ditty.recipe import compile_recipe

    dry, args = take_option(args, ("--print-command",), has_value=False)
    trust, args = take_option(args, (TRUST_FLAG,), has_value=False)
    if trust:
        raise RecipeError.single(
            f"`ditty rollout-server` imports the code of the recipe you name (its reward functions), as `ditty run` "
            f"does, from the current directory and PYTHONPATH: {TRUST_FLAG} is for the commands that read a run "
            "directory someone else may have written",
            fix=f"leave {TRUST_FLAG} out",
        )
    ref, flags = _recipe_and_flags(args, "rollout-server")
    loaded = _load(ref, flags)
    plan = compile_recipe(loaded)
    print_warnings(plan)
    if plan.errors:
        raise RecipeError(plan.errors, source=plan.source)
    command, env = server_command(loaded.config)
    if dry:
        print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(command))
        return 0
    if importlib.util.find_spec("vllm") is None:
        from ditty.objectives.sampling.vllm_sampler import HOW_TO_INSTALL

        raise RecipeError.single(
            "`ditty rollout-server` runs a vLLM server, and vllm is not installed", fix=HOW_TO_INSTALL
        )
    print(f"rollout server for {plan.source or ref}: {shlex.join(command)}", file=sys.stderr, flush=True)
    child = subprocess.Popen(command, env={**os.environ, **env})
    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731  (Ctrl-C, a process manager's stop)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def server_command(config) -> tuple[list[str], dict[str, str]]:
    """(the `vllm serve` command line for the recipe, the environment it needs)."""
    from ditty.objectives.table import objective_for

    rollout, model = config.rollout, config.model
    if "rollout" not in objective_for(config).sections:
        raise RecipeError.single(
            key="rl.kind",
            message="`ditty rollout-server` serves the samples of a recipe that samples from its policy (an [rl] "
            'recipe, online pairs or distillation), and this one trains "'
            f'{objective_for(config).name}"',
            fix='set [rl] kind, preference.pairs = "online" or [distill] kind',
        )
    if model.init == "random" or not model.path:
        raise RecipeError.single(
            key="model.path",
            message="the rollout server starts from a saved model (the run sends its weights later): there is none",
            fix="set model.path to a Hugging Face directory or hub id of the policy's architecture",
        )
    address = urlparse(rollout.vllm_server)
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model.path,
        "--served-model-name", SERVED_NAME,
        "--tokenizer", config.tokenizer.path or model.path,
        "--max-model-len", str(config.data.max_seq_len + rollout.max_new_tokens),
        "--logprobs-mode", "processed_logprobs",
        "--seed", str(config.run.seed),
        "--host", address.hostname or "127.0.0.1",
        "--port", str(address.port or 8000),
        # model.dtype "auto" is fp32 on a CPU (as the trainer loads it); vLLM's "auto" would halve it.
        "--dtype", model.dtype if model.dtype != "auto" or _has_cuda() else "float32",
    ]  # fmt: skip
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    }
    if not _has_cuda():
        # A CPU: no compilation (minutes, for nothing at this size) and a KV cache of what the rollouts need.
        command += ["--enforce-eager", "--kv-cache-memory-bytes", str(_cpu_kv_bytes(config))]
    else:
        command += ["--gpu-memory-utilization", str(rollout.vllm_memory)]
    return command, env


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _cpu_kv_bytes(config) -> int:
    import torch
    from transformers import AutoConfig

    from ditty.objectives.sampling.vllm_cpu import cpu_kv_bytes

    model_config = AutoConfig.from_pretrained(config.model.path)
    sequences = config.train.global_batch_size
    return cpu_kv_bytes(
        model_config, sequences, config.data.max_seq_len + config.rollout.max_new_tokens, torch.float32, config.rollout
    )
