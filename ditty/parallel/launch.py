"""Start `python -m ditty ARGS` on every local rank through torch.distributed.run (torchrun).

torchrun's own agent does the work: rendezvous (a local store for one node, c10d for several),
restarts off, and when one worker fails it stops all the others (SIGTERM, then SIGKILL), so a rank
that raises ends the whole run in seconds instead of leaving its peers in a collective.

torchrun reports any failed worker as exit 1 with its own traceback. ditty's exit codes say more:
a worker that hits a user error writes its message to $DITTY_ERROR_DIR (see
`ditty._utils.dist.record_user_error`) and exits 2; `launch` prints that message and returns 2. A
worker that crashes records when (`record_failure`), so `launch` can name the rank that failed
first rather than a peer that only lost its connection to it.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import uuid
from typing import Optional

from ditty._utils.dist import ERROR_DIR_ENV

# How often the agent checks its workers (torchrun's default 0.1 s polls constantly on 2 cores).
MONITOR_INTERVAL_S = 0.5
USER_ERROR = 2
FAILURE = 1


def torchrun_args(
    argv_for_worker: list[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: Optional[str] = None,
    module: str = "ditty",
    run_id: Optional[str] = None,
    rdzv_timeout_s: Optional[int] = None,
) -> list[str]:
    """The torchrun command line (without "torchrun") that runs `python -m MODULE ARGV` per rank."""
    args = [
        "--nproc-per-node",
        str(nproc_per_node),
        "--max-restarts",
        "0",
        "--monitor-interval",
        str(MONITOR_INTERVAL_S),
    ]
    if nnodes > 1:
        if not rdzv_endpoint:
            from ditty.config.errors import RecipeError

            raise RecipeError.single(
                "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)",
                fix="e.g. --rdzv-endpoint node0.example:29400",
            )
        args += [
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(node_rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rdzv_endpoint,
            "--rdzv-id",
            run_id or os.environ.get("DITTY_RUN_ID", "ditty"),
        ]
        if rdzv_timeout_s is not None:
            args += ["--rdzv-conf", f"join_timeout={rdzv_timeout_s}"]
    else:
        args += ["--standalone"]
    return args + ["-m", module, *argv_for_worker]


def launch(
    argv_for_worker: list[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: Optional[str] = None,
    module: str = "ditty",
    run_id: Optional[str] = None,
    rdzv_timeout_s: Optional[int] = None,
) -> int:
    """Run the workers; return 0, 2 (a worker's user error, its message printed) or 1 (a failure)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args(
        torchrun_args(
            argv_for_worker,
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            node_rank=node_rank,
            rdzv_endpoint=rdzv_endpoint,
            module=module,
            run_id=run_id,
            rdzv_timeout_s=rdzv_timeout_s,
        )
    )
    if args.standalone:  # what torch.distributed.run.run does for --standalone
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, cmd, cmd_args = config_from_args(args)
    with tempfile.TemporaryDirectory(prefix="ditty-errors-") as error_dir:
        previous = os.environ.get(ERROR_DIR_ENV)
        os.environ[ERROR_DIR_ENV] = error_dir  # the agent passes its environment on to the workers
        try:
            elastic_launch(config=config, entrypoint=cmd)(*cmd_args)
            return 0
        except ChildFailedError as failure:
            return _report(failure, error_dir)
        except RendezvousError as error:  # e.g. a node that never joined: no worker ever ran
            print(
                f"error: the rendezvous at {args.rdzv_endpoint} failed ({type(error).__name__}: {error}); start all "
                f"{nnodes} nodes with the same --rdzv-endpoint and --nnodes",
                file=sys.stderr,
            )
            return FAILURE
        finally:
            if previous is None:
                os.environ.pop(ERROR_DIR_ENV, None)
            else:
                os.environ[ERROR_DIR_ENV] = previous


def _report(failure, error_dir: str) -> int:
    """Print what the user needs from a failed launch; return the exit code."""
    messages = sorted(glob.glob(os.path.join(error_dir, "rank-*.txt")), key=_rank_of)
    if messages:
        with open(messages[0], encoding="utf-8") as handle:
            text = handle.read().rstrip()
        print(text, file=sys.stderr)
        return USER_ERROR
    codes = {rank: f.exitcode for rank, f in failure.failures.items()}
    if USER_ERROR in codes.values():
        rank = min(r for r, code in codes.items() if code == USER_ERROR)
        print(
            f"error: rank {rank} stopped on a user error (exit code 2); its message is in its output above",
            file=sys.stderr,
        )
        return USER_ERROR
    first = _first_recorded_failure(error_dir)
    if first is not None:
        rank, summary = first
        print(
            f"error: rank {rank} failed first: {summary} (its traceback is above; the other ranks stopped "
            "because of it)",
            file=sys.stderr,
        )
        return FAILURE
    listed = ", ".join(f"rank {r} (exit code {c})" for r, c in sorted(codes.items()))
    print(f"error: {listed} failed; see the tracebacks above", file=sys.stderr)
    return FAILURE


def _first_recorded_failure(error_dir: str) -> Optional[tuple[int, str]]:
    """The earliest `record_failure` line: (rank, summary). A crash makes its peers fail after it."""
    found = []
    for path in glob.glob(os.path.join(error_dir, "failure-*.txt")):
        try:
            with open(path, encoding="utf-8") as handle:
                stamp, _, summary = handle.read().partition("\n")
            found.append((int(stamp), int(os.path.basename(path)[len("failure-") : -len(".txt")]), summary))
        except (OSError, ValueError):
            continue
    if not found:
        return None
    _, rank, summary = min(found)
    return rank, summary


def _rank_of(path: str) -> int:
    try:
        return int(os.path.basename(path)[len("rank-") : -len(".txt")])
    except ValueError:
        return 1 << 30
