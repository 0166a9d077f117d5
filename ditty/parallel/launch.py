"""Start `python -m ditty ARGS` on every local rank through torch.distributed.run (torchrun).

torchrun's own agent does the work: rendezvous (a local store for one node, c10d for several),
restarts off, and when one worker fails it stops all the others (SIGTERM, then SIGKILL), so a rank
that raises ends the whole run in seconds instead of leaving its peers in a collective.

torchrun reports any failed worker as exit 1 with its own traceback. ditty's exit codes say more:
a worker that hits a user error writes its message to $DITTY_ERROR_DIR (see
`ditty._utils.dist.record_user_error`) and exits 2; `launch` prints that message and returns 2. A
worker that crashes records when (`record_failure`), so `launch` can name the rank that failed
first rather than a peer that only lost its connection to it; a rank killed by a signal from
outside (SIGKILL from the out-of-memory killer or `kill -9`) records nothing, and is named as the
first failure, since its peers only fail once they lose it.

Stopping: SIGTERM or SIGINT (Ctrl-C) to the launcher is forwarded once to every worker (torchrun
starts them in sessions of their own, so a terminal's Ctrl-C reaches the launcher alone); each
finishes its step, they save one checkpoint together, and the launcher exits with 128 + the
signal (143, 130), as one process would, after waiting up to `DITTY_SHUTDOWN_TIMEOUT_S` (default
600 s) for the save. Launcher death: each worker asks the kernel to send it SIGTERM when its parent
dies (`die_with_launcher`, Linux's PR_SET_PDEATHSIG), so a `kill -9` of the launcher never leaves
workers training with no parent: they save and exit within a step.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import sys
import tempfile
import uuid
from typing import Optional

from ditty._utils.dist import ERROR_DIR_ENV, STOP_FILE

# How often the agent checks its workers (torchrun's default 0.1 s polls constantly on 2 cores).
MONITOR_INTERVAL_S = 0.5
USER_ERROR = 2
FAILURE = 1
LAUNCHER_PID_ENV = "DITTY_LAUNCHER_PID"
SHUTDOWN_TIMEOUT_ENV = "DITTY_SHUTDOWN_TIMEOUT_S"
DEFAULT_SHUTDOWN_TIMEOUT_S = 600
"""How long a signalled launcher waits for its workers to save and exit before it SIGKILLs them."""
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_launcher(sig: int = signal.SIGTERM) -> bool:
    """In a torchrun worker on Linux: have the kernel send `sig` to this process when its parent
    (the launcher) dies. SIGTERM takes the trainer's preemption path: finish the step, save, exit.

    Called as early as possible in a worker; if the launcher is already gone by then (its pid,
    which ditty's launcher passes in $DITTY_LAUNCHER_PID, is no longer the parent), the signal is
    sent at once. Returns whether the request was made.
    """
    if not sys.platform.startswith("linux") or "LOCAL_RANK" not in os.environ:
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher and launcher.isdigit() and os.getppid() != int(launcher):
        os.kill(os.getpid(), sig)  # orphaned before the request: the kernel will not send it any more
    return True


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
    worker_env: Optional[dict[str, str]] = None,
) -> int:
    """Run the workers; return 0, 2 (a worker's user error, its message printed) or 1 (a failure).
    `worker_env`: variables the workers need before they start (set here for the run's length)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
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
    config.shutdown_timeout = int(os.environ.get(SHUTDOWN_TIMEOUT_ENV, DEFAULT_SHUTDOWN_TIMEOUT_S))
    with tempfile.TemporaryDirectory(prefix="ditty-errors-") as error_dir:
        ours = {**(worker_env or {}), ERROR_DIR_ENV: error_dir, LAUNCHER_PID_ENV: str(os.getpid())}
        previous = {name: os.environ.get(name) for name in ours}
        os.environ.update(ours)  # the agent passes its environment on to the workers
        try:
            elastic_launch(config=config, entrypoint=cmd)(*cmd_args)
            return _stopped_workers(error_dir)
        except SignalException as stop:  # the agent forwarded the signal and waited for the workers
            return _report_stop(stop.sigval, error_dir)
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
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _stopped_workers(error_dir: str) -> int:
    """After the workers all exited 0: 128 + the signal that stopped them (one of them was sent it:
    they saved together and rank 0 said where), or 0 when they finished."""
    signals = []
    for path in glob.glob(os.path.join(error_dir, STOP_FILE.format(rank="*"))):
        try:
            with open(path, encoding="utf-8") as handle:
                found = re.search(r"signal (\d+)", handle.read())
        except OSError:
            continue
        if found:
            signals.append(int(found.group(1)))
    return 128 + max(signals) if signals else 0


def _report_stop(signum: int, error_dir: str) -> int:
    """A signal stopped the run: the workers (rank 0) printed where the checkpoint is; exit 128 + signal."""
    name = signal.Signals(signum).name
    if not glob.glob(os.path.join(error_dir, STOP_FILE.format(rank="*"))):
        print(
            f"stopped by {name} before the workers could save a checkpoint (they were still starting, or did not "
            "finish a step in time); a rerun resumes from the newest checkpoint already in the run directory",
            file=sys.stderr,
        )
    return 128 + int(signum)


def _report(failure, error_dir: str) -> int:
    """Print what the user needs from a failed launch; return the exit code."""
    messages = sorted(glob.glob(os.path.join(error_dir, "rank-*.txt")), key=_rank_of)
    if messages:
        with open(messages[0], encoding="utf-8") as handle:
            text = handle.read().rstrip()
        print(text, file=sys.stderr)
        return USER_ERROR
    codes = {rank: f.exitcode for rank, f in failure.failures.items()}
    stopped = {code for code in codes.values() if code in (128 + signal.SIGTERM, 128 + signal.SIGINT)}
    if stopped and set(codes.values()) == stopped and glob.glob(os.path.join(error_dir, STOP_FILE.format(rank="*"))):
        # A signal sent to a worker rather than to the launcher: the workers saved and stopped together
        # (rank 0 printed where the checkpoint is); exit as the launcher would have for that signal.
        return max(stopped)
    if USER_ERROR in codes.values():
        rank = min(r for r, code in codes.items() if code == USER_ERROR)
        print(
            f"error: rank {rank} stopped on a user error (exit code 2); its message is in its output above",
            file=sys.stderr,
        )
        return USER_ERROR
    first = _first_recorded_failure(error_dir)
    if first is not None and "timed out" in first[1].lower():
        # A rank gave up on a collective after $DITTY_DIST_TIMEOUT_S: a peer stopped answering (stopped,
        # hung). Such a peer ignores the agent's SIGTERM and gets its SIGKILL: that kill is the
        # launcher's, not the out-of-memory killer's, so the timeout is what is reported.
        rank, summary = first
        silent = ", ".join(str(r) for r in sorted(codes) if r != rank) or "a peer"
        print(
            f"error: rank {rank} failed first: a collective timed out waiting for rank {silent}, which stopped "
            f"answering (stopped or hung; the launcher then ended it) ({summary}). DITTY_DIST_TIMEOUT_S sets "
            "how long a collective waits",
            file=sys.stderr,
        )
        return FAILURE
    killed = _killed_from_outside(codes)
    if killed is not None:
        rank, how = killed
        others = ", ".join(str(r) for r in sorted(codes) if r != rank)
        print(
            f"error: rank {rank} failed first: it was killed by {how} from outside the run (the out-of-memory "
            f"killer, or a kill -9){f'; the other ranks ({others}) stopped because they lost it' if others else ''}",
            file=sys.stderr,
        )
        return FAILURE
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


def _killed_from_outside(codes: dict[int, int]) -> Optional[tuple[int, str]]:
    """The lowest rank that died of a signal the agent does not send when it stops workers
    (it sends SIGTERM, then SIGKILL only after its shutdown timeout): (rank, signal name)."""
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    for rank, code in sorted(codes.items()):
        if code is not None and code < 0 and -code not in stop_signals:
            try:
                return rank, signal.Signals(-code).name
            except ValueError:
                return rank, f"signal {-code}"
    return None


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
