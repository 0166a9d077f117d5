"""Run the fault-injection suite (tests/reliability) and write its table into RELIABILITY.md.

    python tools/reliability_table.py --repeat 3 --full --kills 5

Each repetition runs `pytest tests/reliability` with DITTY_RELIABILITY_RECORD set, so every fault
test appends one record (fault, how injected, exit code, steps lost, passed or not); `--full` also
runs the combinations make test leaves out (every optimizer with and without an adapter, SIGINT)
and `--kills N` makes N kill -9s at random moments per repetition (a different seed each time).
The table between the markers in RELIABILITY.md is replaced; the text around it is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- reliability-table:begin -->", "<!-- reliability-table:end -->"


def run_suite(repeat: int, full: bool, kills: int, workers: int, extra: list[str]) -> tuple[list[dict], float]:
    records_path = Path(tempfile.mkdtemp(prefix="ditty-reliability-")) / "records.jsonl"
    started = time.monotonic()
    for index in range(repeat):
        env = dict(os.environ, DITTY_RELIABILITY_RECORD=str(records_path), DITTY_RELIABILITY_SEED=str(index))
        env["DITTY_RELIABILITY_KILLS"] = str(kills)
        if full:
            env["DITTY_RELIABILITY_FULL"] = "1"
        command = [sys.executable, "-m", "pytest", "tests/reliability", "-q", "-p", "no:cacheprovider"]
        command += ["-n", str(workers), "--dist", "loadgroup"] if workers > 1 else ["-n", "0"]
        print(f"repetition {index + 1}/{repeat}: {' '.join(command[2:] + extra)}", flush=True)
        subprocess.run(command + extra, cwd=ROOT, env=env, check=False)
    records = [json.loads(line) for line in records_path.read_text().splitlines()] if records_path.exists() else []
    return records, time.monotonic() - started


def table(records: list[dict]) -> str:
    by_fault: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_fault[record["fault"]].append(record)
    lines = [
        "| fault | how injected | tried | survived | data lost (steps) | exit code |",
        "|---|---|---|---|---|---|",
    ]
    for fault in sorted(by_fault):
        trials = by_fault[fault]
        injected = sorted({t.get("injected", "") for t in trials})
        how = injected[0] if len(injected) == 1 else f"{injected[0]} (and {len(injected) - 1} other moments)"
        lost = sorted({t.get("lost_steps") for t in trials if t.get("lost_steps") is not None})
        lost_text = str(lost[0]) if len(lost) == 1 else f"{lost[0]}-{lost[-1]}" if lost else "-"
        codes = sorted({str(t.get("exit_code")) for t in trials if t.get("exit_code") is not None})
        survived = sum(bool(t.get("survived")) for t in trials)
        lines.append(f"| {fault} | {how} | {len(trials)} | {survived} | {lost_text} | {', '.join(codes) or '-'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-o", "--output", default=str(ROOT / "RELIABILITY.md"))
    args, extra = parser.parse_known_args()
    records, seconds = run_suite(args.repeat, args.full, args.kills, args.workers, extra)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    flags = f"--repeat {args.repeat}" + (" --full" if args.full else "") + f" --kills {args.kills}"
    body = (
        f"{table(records)}\n\n"
        f"Made by `python tools/reliability_table.py {flags}`: {len(records)} trials in {seconds / 60:.0f} min "
        f"on {platform.machine()} ({os.cpu_count()} cores, load average {load:.1f} at the end).\n"
    )
    path = Path(args.output)
    text = path.read_text() if path.exists() else f"# Reliability\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{body}{END}{tail}")
    print(body)
    failed = [r for r in records if not r.get("survived")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
