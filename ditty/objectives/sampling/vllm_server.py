"""`rollout.backend = "vllm-server"`: rollouts from a vLLM server in another process or on another machine.

The server is `ditty rollout-server RECIPE` (ditty.cli.rollout_server) or the user's own
`VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --logprobs-mode processed_logprobs`, at `rollout.vllm_server`.
ditty speaks its OpenAI-compatible completions endpoint with token ids in and out: one request per
prompt (prompt = its token ids, n = group_size, the seed of the prompt's global position, logprobs=0,
return_token_ids), sent together so the server batches them.

Weights go by a path: when the policy moved, rank 0 writes its full weights (gathered, merged under
LoRA: ditty.objectives.sampling.policy_weights) as safetensors under the run directory
(rollout_weights/v<version>/, removed when the run ends), and asks the server to reload them in place
(`POST /collective_rpc`, method reload_weights, `weights_path`: the server reads the file, so the run
directory must be on its disk: one machine or a shared one). Where NCCL joins the two, vLLM's
weight-transfer API would avoid the disk; that path is not built here (no GPU to test it on).

Failures are bounded: a request that times out (`rollout.vllm_timeout_s`) or finds no server is retried
`rollout.vllm_retries` times, 2 s apart and doubling; then the run stops with exit code 2 naming the server
and the fix, its last checkpoint intact, and the same command resumes it once the server is back. A
server too old to reload weights, without its dev endpoints, or scoring log-probabilities before the
temperature is refused at the first contact.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from ditty.config.errors import RecipeError
from ditty.objectives.sampling.batch import RolloutBatch
from ditty.objectives.sampling.sampler import Sampler, TurnOutput, new_tokens, prompt_seed, rollouts_from_tokens

log = logging.getLogger(__name__)

START_IT = "start it with `ditty rollout-server RECIPE` (same recipe and flags) or check rollout.vllm_server"
MIN_VERSION = (0, 32)
"""The oldest vLLM whose server ditty was tested with (reload_weights with weights_path, return_token_ids)."""
REQUESTS_IN_FLIGHT = 32
"""Prompts sent to the server at once (it batches them); more only queue in its scheduler."""


class ServerError(Exception):
    """The server answered with an error status (not retried: a retry would get the same answer)."""


class ServerSampler(Sampler):
    """See the module doc."""

    holds_weights = True

    def __init__(
        self, policy: Any, rollout: Any, group_size: int, tokenizer: Any, *, seed: int, run_dir: str, rank: int = 0
    ) -> None:
        self.policy, self.rollout, self.group_size = policy, rollout, group_size
        self.tokenizer, self.seed = tokenizer, seed
        self.url = rollout.vllm_server.rstrip("/")
        self.rank = rank
        self.weights_dir = os.path.join(run_dir or ".", "rollout_weights")
        self.captured: Optional[int] = None
        self.version: Optional[int] = None
        self.pool = ThreadPoolExecutor(max_workers=REQUESTS_IN_FLIGHT, thread_name_prefix="ditty-rollout-request")
        self.model = self.check_server()

    # -------------------------------------------------------------- the server

    def request(self, path: str, body: Optional[dict] = None) -> Any:
        """The server's JSON answer to GET (no body) or POST `path`, retried as the module doc says."""
        data = json.dumps(body).encode() if body is not None else None
        delay, tries = 2.0, max(1, self.rollout.vllm_retries)
        for attempt in range(1, tries + 1):
            call = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(call, timeout=self.rollout.vllm_timeout_s) as response:
                    text = response.read()
                return json.loads(text) if text else None
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")[:500]
                raise ServerError(f"{path}: HTTP {err.code}: {detail}") from err
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                reason = getattr(err, "reason", err)
                if attempt == tries:
                    raise RecipeError.single(
                        key="rollout.vllm_server",
                        message=f"the rollout server at {self.url} did not answer {path} after {tries} tries "
                        f"(each at most rollout.vllm_timeout_s = {self.rollout.vllm_timeout_s:g} s): {reason}",
                        fix=f"{START_IT}; the run stopped at its last checkpoint: the same command resumes it",
                    ) from err
                log.warning("rollout server %s%s: %s; retrying in %.0f s", self.url, path, reason, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def check_server(self) -> str:
        """The served model's name, once the server is known to be able to serve this run."""
        version = str((self.request("/version") or {}).get("version", "0"))
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < MIN_VERSION:
            raise RecipeError.single(
                key="rollout.vllm_server",
                message=f"the rollout server at {self.url} runs vLLM {version}; ditty needs vLLM >= "
                f"{'.'.join(map(str, MIN_VERSION))} (weights reloaded from a path, token ids returned)",
                fix="upgrade vllm where the server runs (`make setup-vllm` on a CPU machine)",
            )
        try:
            info = self.request("/server_info?config_format=json")
        except ServerError as err:
            raise RecipeError.single(
                key="rollout.vllm_server",
                message=f"the rollout server at {self.url} has no dev endpoints ({err}): ditty cannot send it weights",
                fix="start it with VLLM_SERVER_DEV_MODE=1 (`ditty rollout-server` does)",
            ) from err
        mode = (info.get("vllm_config") or {}).get("model_config", {}).get("logprobs_mode")
        if mode not in (None, "processed_logprobs"):
            raise RecipeError.single(
                key="rollout.vllm_server",
                message=f"the rollout server scores log-probabilities as {mode!r}, before the sampling temperature: "
                "the trainer's comparison and correction need them as sampled",
                fix="start it with --logprobs-mode processed_logprobs (`ditty rollout-server` does)",
            )
        models = (self.request("/v1/models") or {}).get("data") or []
        if not models:
            raise RecipeError.single(
                key="rollout.vllm_server", message=f"the rollout server at {self.url} serves no model", fix=START_IT
            )
        needed = self.rollout.max_new_tokens + 1
        served = models[0]
        if served.get("max_model_len") and served["max_model_len"] < needed:
            raise RecipeError.single(
                key="rollout.vllm_server",
                message=f"the rollout server's max_model_len {served['max_model_len']} is shorter than "
                f"rollout.max_new_tokens = {self.rollout.max_new_tokens} after a prompt",
                fix="start it with a larger --max-model-len (`ditty rollout-server` uses data.max_seq_len + "
                "rollout.max_new_tokens)",
            )
        return served["id"]

    # -------------------------------------------------------------- weights

    def capture(self, version: int, copy: bool = False) -> Optional[tuple[int, str]]:
        """(version, the directory rank 0 wrote its weights to), or None when the server holds `version`
        already. Every rank runs it (FSDP's gather is a collective); the file is the copy `copy` asks for."""
        if version == self.captured:
            return None
        from ditty.objectives.sampling.policy_weights import stream_policy_weights, weight_buckets

        self.captured = version
        directory = os.path.join(self.weights_dir, f"v{version}")
        partial = directory + ".partial"
        if self.rank == 0:
            os.makedirs(self.weights_dir, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
        # Every rank gathers every parameter (a collective), one bucket at a time; rank 0 writes each
        # bucket as a safetensors shard before the next is gathered.
        stream = stream_policy_weights(self.policy(), cpu=True)
        buckets = weight_buckets(stream, self.rollout.sync_bucket_mb * 2**20)
        write_shards(buckets, partial if self.rank == 0 else None)
        if self.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(partial, directory)  # the server never reads a half-written file
        return version, os.path.abspath(directory)

    def load(self, captured: tuple[int, str]) -> None:
        version, directory = captured
        if self.rank == 0:
            try:
                self.request(
                    "/collective_rpc",
                    {
                        "method": "reload_weights",
                        "kwargs": {"weights_path": directory},
                        "timeout": self.rollout.vllm_timeout_s,
                    },
                )
            except ServerError as err:
                raise RecipeError.single(
                    key="rollout.vllm_server",
                    message=f"the rollout server could not reload the weights from {directory}: {err}",
                    fix="the server must read the run directory (one machine or a shared disk), and serve the "
                    "same architecture as model.path",
                ) from err
            for name in os.listdir(self.weights_dir):  # the versions before this one are read and done with
                if name.startswith("v") and name != f"v{version}" and not name.endswith(".partial"):
                    shutil.rmtree(os.path.join(self.weights_dir, name), ignore_errors=True)
        barrier()  # no rank samples before the server holds this version
        self.version = version

    # -------------------------------------------------------------- sampling

    def sample(
        self, prompt_ids: list[list[int]], first_position: int = 0, max_new_tokens: Optional[int] = None
    ) -> RolloutBatch:
        eos = self.tokenizer.eos_token_id
        bodies = [
            {
                "model": self.model,
                "prompt": list(ids),
                "n": self.group_size,
                "seed": prompt_seed(self.seed, first_position + i),
                "temperature": self.rollout.temperature,
                "top_p": self.rollout.top_p,
                "max_tokens": new_tokens(self.rollout, max_new_tokens),
                "logprobs": 0,
                "return_token_ids": True,
                "stop_token_ids": [eos] if eos is not None else [],
            }
            for i, ids in enumerate(prompt_ids)
        ]
        answers = list(self.pool.map(self.complete, bodies))
        prompts, completions, logps = [], [], []
        for ids, answer in zip(prompt_ids, answers):
            for choice in sorted(answer["choices"], key=lambda c: c["index"]):
                prompts.append(ids)
                completions.append(list(choice["token_ids"]))
                values = (choice.get("logprobs") or {}).get("token_logprobs")
                logps.append([float("nan") if v is None else v for v in values] if values else [])
        return rollouts_from_tokens(prompts, completions, logps, eos, self.tokenizer)

    def complete(self, body: dict) -> dict:
        try:
            return self.request("/v1/completions", body)
        except ServerError as err:
            raise RecipeError.single(
                key="rollout.vllm_server", message=f"the rollout server refused a sampling request: {err}", fix=START_IT
            ) from err

    def generate_turn(self, turn: Any) -> TurnOutput:
        """Episodes of several turns sample in the training process (generate, or the vllm engine):
        the compiler refuses them with a server, so no run gets here."""
        raise RecipeError.single(
            key="rollout.backend",
            message='episodes of several turns sample with "generate" or "vllm", not a rollout server',
            fix='set rollout.backend = "vllm"',
        )

    def close(self) -> None:
        """At the end of the run (or after an error): the weights written for the server go (a resume
        writes its own before its first sample)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.rank == 0:
            shutil.rmtree(self.weights_dir, ignore_errors=True)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def write_shards(buckets: Any, directory: Optional[str]) -> None:
    """Each bucket of (name, tensor) as a safetensors shard of `directory`, with the index Hugging Face
    and vLLM read (model.safetensors.index.json); `directory` None consumes them (the other ranks).
    Written here rather than by huggingface_hub's split_torch_state_dict_into_shards, which plans the
    shards from a whole state dict: these weights arrive one gathered bucket at a time."""
    from safetensors.torch import save_file

    weight_map: dict[str, str] = {}
    total = 0
    for index, bucket in enumerate(buckets):
        if directory is None:
            continue
        name = f"model-{index + 1:05d}.safetensors"
        save_file({key: t.contiguous() for key, t in bucket}, os.path.join(directory, name))
        for key, tensor in bucket:
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()
    if directory is not None:
        with open(os.path.join(directory, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle)
