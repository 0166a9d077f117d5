"""lm-eval's task data without a network: cached data or a clear error, never a minute of retries.

lm-eval loads a task's dataset through `datasets`, which asks the Hugging Face Hub first. With no
network and no offline switch set, huggingface_hub retries each request with backoff (25-50 s)
and the evaluation ends in a ConnectionError traceback. So before scoring, one connection to the
Hub's endpoint is tried (a few seconds at most); when it fails, the libraries' own offline switch
(`HF_HUB_OFFLINE`, as huggingface_hub and datasets read it) is on for the evaluation, so cached
data loads and missing data fails at once, and that failure is a user error naming the tasks.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Iterator, Optional, Sequence
from urllib.parse import urlparse

from ditty.config.errors import RecipeError

PROBE_TIMEOUT_S = 5.0


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def already_offline() -> bool:
    import datasets.config
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE)


def hub_reachable(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the endpoint opens (no request is sent)."""
    parsed = urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:  # no route, name not resolved, refused, timed out
        return False


@contextlib.contextmanager
def offline_switch() -> Iterator[None]:
    """huggingface_hub's and datasets' offline mode on for the code inside, then as it was."""
    import datasets.config
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


@contextlib.contextmanager
def task_data_or_explain(tasks: Sequence[str]) -> Iterator[None]:
    """Run lm-eval inside: offline at once when the Hub cannot be reached, and a task whose data is
    neither reachable nor cached is a RecipeError (exit code 2) instead of a ConnectionError."""
    unreachable: Optional[str] = None
    if not already_offline() and not hub_reachable(hub_endpoint()):
        unreachable = hub_endpoint()
    switch = offline_switch() if unreachable else contextlib.nullcontext()
    try:
        with switch:
            yield
    except ConnectionError as error:  # datasets' "Couldn't reach 'ID' on the Hub (OfflineModeIsEnabled)"
        named = ", ".join(tasks)
        why = f"ditty cannot reach the Hub at {unreachable}" if unreachable else "offline mode is on (HF_HUB_OFFLINE)"
        raise RecipeError.single(
            f"the data of lm-eval task{'s' if len(tasks) > 1 else ''} {named} is not available offline: {why}, "
            f"and it is not in the datasets cache ({error})",
            key="eval.harness_tasks",
            fix="run once with network access to fill the cache (~/.cache/huggingface), or define the task over "
            "local files (dataset_path: json, data_files) with --include-path",
        ) from None
