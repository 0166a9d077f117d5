"""Hangs: a peer that stops answering during a save, and a Hub that accepts and never answers.

The issue's cases: with rank 1 stopped (SIGSTOP) during a save, rank 0 waited more than 265 s (the
checkpoint group had torch's 30-minute default, not DITTY_DIST_TIMEOUT_S), and the message then
blamed the out-of-memory killer for the SIGKILL torchrun itself sent; `ditty push` against an
endpoint that never answers hung with no output and rewrote final/README.md.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.reliability.helpers import ditty, ditty_process, write_recipe

TIMEOUT_S = 20


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_a_rank_stopped_during_a_save_ends_the_run_within_the_timeout(tmp_path, trial):
    trial.update(
        fault="rank 1 stopped (SIGSTOP) during a save of a 2-process run",
        injected=f"SIGSTOP to rank 1 as the step-4 save begins; DITTY_DIST_TIMEOUT_S = {TIMEOUT_S}",
    )
    recipe = write_recipe(tmp_path, steps=8)
    text = 'trainer = "tests.reliability.hooks:StopInSave"\n' + recipe.read_text()
    recipe.write_text(text.replace("[logging]", '[parallel]\nkind = "ddp"\n\n[logging]'))
    env = {
        "DITTY_DIST_TIMEOUT_S": str(TIMEOUT_S),
        "DITTY_TEST_STOP_AT_STEP": "4",
        "DITTY_TEST_STOP_RANK": "1",
        "DITTY_SHUTDOWN_TIMEOUT_S": "5",
    }
    launcher = ditty_process("run", str(recipe), "--nproc-per-node", "2", env=env, wait=False)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        stopped_at = None
        while stopped_at is None:  # wait for rank 1 to stop itself
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "rank 1 never reached the save"
            workers = psutil.Process(launcher.pid).children()
            if any(w.status() == psutil.STATUS_STOPPED for w in workers):
                stopped_at = time.monotonic()
            time.sleep(0.2)
        rank0 = next(w for w in workers if w.environ().get("RANK") == "0")
        _, alive = psutil.wait_procs([rank0], timeout=TIMEOUT_S + 30)
        gave_up_after = time.monotonic() - stopped_at
        assert not alive, f"rank 0 still waiting {TIMEOUT_S + 30} s after rank 1 stopped"
        out, err = launcher.communicate(timeout=120)
    finally:
        for process in [*workers, launcher]:
            try:
                process.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
    trial.update(exit_code=launcher.returncode, lost_steps=2, seconds=round(gave_up_after, 1))
    assert launcher.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank"), last
    assert "out-of-memory" not in err and "Traceback" not in err, err[-3000:]
    assert "timed out" in last or "did not answer" in last, last


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection, reads what arrives and never answers;
    it stops itself after `lifetime` seconds so a test that goes wrong cannot leave it behind."""

    def __init__(self, lifetime: float = 180.0) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.5)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.deadline = time.monotonic() + lifetime
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while time.monotonic() < self.deadline:
            try:
                connection, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.accepted += 1
            self.connections.append(connection)  # held open, never answered
        self.close()

    def close(self) -> None:
        self.deadline = 0
        for connection in self.connections:
            connection.close()
        self.sock.close()


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finished")
    result = ditty("run", str(write_recipe(tmp, steps=3)))
    assert result.code == 0, result.err[-3000:]
    return tmp / "run"


@pytest.mark.slow
def test_a_hub_that_never_answers_is_a_timeout_and_the_run_is_unchanged(finished_run, trial):
    trial.update(
        fault="ditty push to a Hub that accepts and never answers",
        injected="HF_ENDPOINT at a 127.0.0.1 socket that never answers; DITTY_HUB_TIMEOUT_S = 3",
    )
    server = SilentServer()
    before = _snapshot(finished_run)
    started = time.monotonic()
    try:
        env = {
            "HF_ENDPOINT": server.url,
            "HF_TOKEN": "hf_" + "x" * 34,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0",
            "DITTY_HUB_TIMEOUT_S": "3",
        }
        done = ditty_process("push", str(finished_run), "--repo-id", "me/never", env=env, timeout=120)
    finally:
        server.close()
    seconds = time.monotonic() - started
    trial.update(exit_code=done.returncode, lost_steps=0, seconds=round(seconds, 1))
    assert server.accepted >= 1  # the push reached the server
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"waiting for the Hub at {server.url} to create or find the repository me/never" in done.stderr
    assert "no answer within 3 s" in done.stderr and "every local file is kept" in done.stderr, done.stderr
    assert seconds < 3 * 6 + 30, f"took {seconds:.0f} s"
    assert _snapshot(finished_run) == before  # final/README.md included: nothing written
