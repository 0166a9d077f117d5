"""Where logged metrics go: metrics.jsonl always, TensorBoard and wandb when asked.

A metrics record is a flat dict of JSON-able scalars with at least `step`. The JSONL file is the
source of truth (`plot_run` redraws the curves from it); the other sinks are views of the same
records. Each sink flushes per record: a crash loses at most the line being written.

metrics.jsonl is written with one `write` system call per record on a file opened for appending,
so a record is never split by another writer's; readers (`load_metrics`) skip and count a line
that does not parse (the last line of a run killed mid-write).
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Optional, Protocol

from ditty._utils.dist import is_main_process
from ditty._utils.errors import RunFailure
from ditty.config.sections import LoggingConfig

METRICS_FILE = "metrics.jsonl"

log = logging.getLogger(__name__)


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _jsonable(value: Any) -> Any:
    """JSON has no NaN/Infinity: write them as strings so the file stays valid for every reader."""
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar; .item() on a CUDA tensor is a sync
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    return value


class JsonlSink:
    """metrics.jsonl: one JSON object per logged step, each appended with a single write call."""

    def __init__(self, run_dir: str, append: bool = False):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, METRICS_FILE)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | (0 if append else os.O_TRUNC)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)
        if append and os.fstat(self._fd).st_size and not _ends_with_newline(self.path):
            os.write(self._fd, b"\n")  # a torn last line stays on a line of its own (readers skip it)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: _jsonable(v) for k, v in record.items()}, sort_keys=False)
        data = (line + "\n").encode("utf-8")
        # O_APPEND places the whole buffer at the end in one system call; a short write (a full disk,
        # a signal) is finished by further calls, which is the best a file can do.
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError as error:  # a full disk, most often: say so rather than print a traceback
            raise RunFailure(
                f"could not write {self.path}: {error.strerror}; the checkpoints already saved are intact: "
                "free some space, then run the same command again to resume"
            ) from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


class TensorBoardSink:
    """TensorBoard event files under RUN_DIR/tensorboard (every numeric field becomes a scalar)."""

    def __init__(self, run_dir: str):
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.writer = SummaryWriter(log_dir=os.path.join(run_dir, "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            value = _jsonable(value)
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(_tb_tag(key), value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _tb_tag(key: str) -> str:
    """Group curves in TensorBoard: train/loss, val/loss, val/exact_match, perf/tokens_per_s."""
    if key.startswith("val_"):
        return "val/" + key[4:]
    if key in ("tokens", "tokens_per_s", "elapsed_s"):
        return "perf/" + key
    return "train/" + key


class WandbSink:
    """Weights & Biases, imported only when enabled (the `wandb` extra)."""

    def __init__(self, run_dir: str, project: Optional[str], name: str, config: Optional[dict] = None):
        try:
            import wandb
        except ImportError as exc:  # the compiler should have caught this; say how to fix it anyway
            raise RuntimeError("logging.wandb = true needs the wandb package: pip install 'ditty[wandb]'") from exc
        self._wandb = wandb
        self.run = wandb.init(project=project or "ditty", name=name, dir=run_dir, config=config or {})

    def write(self, record: dict[str, Any]) -> None:
        data = {k: _jsonable(v) for k, v in record.items() if k != "step"}
        self.run.log(data, step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Fans one record out to every sink. On ranks other than 0 it holds no sinks at all."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks

    def log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def build_logger(
    cfg: LoggingConfig,
    run_dir: str,
    *,
    run_name: str = "ditty",
    config_dict: Optional[dict] = None,
    append: bool = False,
) -> MetricsLogger:
    """The sinks `cfg` asks for, on rank 0; an empty logger elsewhere (only rank 0 writes files)."""
    if not is_main_process():
        return MetricsLogger([])
    sinks: list[Sink] = [JsonlSink(run_dir, append=append)]
    if cfg.tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    if cfg.wandb:
        sinks.append(WandbSink(run_dir, cfg.wandb_project, run_name, config_dict))
    return MetricsLogger(sinks)


def read_metrics(run_dir_or_file: str) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl (a run directory or the file itself); "nan" strings become floats.
    Lines that do not parse are skipped (`load_metrics` also counts them)."""
    return load_metrics(run_dir_or_file)[0]


def load_metrics(run_dir_or_file: str) -> tuple[list[dict[str, Any]], int]:
    """(records, unreadable lines skipped): a line cut short by a crash, or anything else that is not
    one JSON object with a whole-number step, is skipped and counted, with a warning."""
    path = run_dir_or_file
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    records = []
    skipped: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
                step = record.get("step") if isinstance(record, dict) else None
                if isinstance(step, bool) or not isinstance(step, int):  # a step of Infinity, "7" or 7.5 too
                    raise ValueError("not a metrics record")
            except ValueError:
                skipped.append(number)
                continue
            for key, value in record.items():
                if value in ("nan", "inf", "-inf"):
                    record[key] = float(value)
            records.append(record)
    if skipped:
        log.warning(
            "%s: skipped %d unreadable line(s) (line %s; a line cut short when a run was killed)",
            path,
            len(skipped),
            ", ".join(str(n) for n in skipped[:5]) + (" ..." if len(skipped) > 5 else ""),
        )
    return records, len(skipped)


def truncate_metrics(run_dir: str, step: int) -> None:
    """Drop metrics.jsonl records past `step` (written by the run after its last checkpoint), so the
    resumed run's records follow on without repeats. Rank 0; rewritten atomically."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not is_main_process() or not os.path.isfile(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if int(json.loads(line)["step"]) <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError, OverflowError):
                continue  # a line cut short by the kill, or not a record (a step of Infinity)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(tmp, path)
