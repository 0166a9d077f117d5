"""A worker for the launcher tests: `python -m tests.parallel.launch_worker MODE OUT_DIR`.

MODE "ok": all ranks meet in an all-reduce and exit 0. "user_error": rank 1 leaves a user-error
message and exits 2 while rank 0 waits in the all-reduce. "crash": rank 1 raises instead.
Each rank writes pid-RANK when it starts and done-RANK if it gets past the all-reduce.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from ditty._utils.dist import record_failure, record_user_error
from ditty.config.errors import RecipeError
from ditty.parallel.env import init_distributed


def main(mode: str, out_dir: str) -> int:
    # A long collective timeout on purpose: the run must end because torchrun tears it down.
    info = init_distributed("cpu", timeout=300)
    with open(os.path.join(out_dir, f"pid-{info.rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    if info.rank == 1 and mode != "ok":
        time.sleep(1.0)  # rank 0 is inside the all-reduce by now
        if mode == "user_error":
            error = RecipeError.single("no such file: missing.jsonl", key="data.path", fix="check the path")
            print(error.format(), file=sys.stderr)
            record_user_error(error.format())
            return 2
        raise RuntimeError("rank 1 broke")
    t = torch.ones(1)
    dist.all_reduce(t)
    with open(os.path.join(out_dir, f"done-{info.rank}"), "w") as handle:
        handle.write(str(float(t)))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main(*sys.argv[1:])
    except Exception as error:  # what the CLI's worker entry does
        record_failure(error)
        raise
    raise SystemExit(code)
