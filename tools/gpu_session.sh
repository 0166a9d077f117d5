#!/usr/bin/env bash
# The checks of one lent GPU session, most valuable first, each under its own time limit so that a
# short lease still brings back the parts that finished. Logs land in $OUT (the device tool's folder;
# /tmp/gpu-out elsewhere). Run from the repository root of a checkout:
#   bash tools/gpu_session.sh [tests] [stages] [bench]       (all three when none is named)
# Packages the machine lacks travel as wheels in .whl/ (BENCHMARKS.md "On one GPU" says which).
# Time limits (seconds): GPU_TESTS_S, GPU_STAGES_S, GPU_BENCH_S; GPU_BENCH_ONLY picks bench variants;
# GPU_DEVICE=cpu GPU_STAGES_ARGS='--train.steps 2' GPU_WHEELS=
# dry-runs the stages on a machine without one.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
wheels=${GPU_WHEELS-.whl}
if [ -n "$wheels" ] && compgen -G "$wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
parts=${*:-tests stages bench}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import sys, torch, transformers, peft; print(sys.version.split()[0], "torch", torch.__version__,
"transformers", transformers.__version__, "peft", peft.__version__)'
    python3 -m pip list 2>/dev/null | grep -i -E "^(torchao|bitsandbytes|liger|cut.cross|datasets|triton) "
} >"$OUT/env.txt" 2>&1

seconds() { python3 -c "import time; print(round(time.time() - $1, 1))"; }

if [[ " $parts " == *" tests "* ]]; then
    # Everything marked gpu: kernels (fused loss, packing, MFU table), whole runs (paths, stages).
    start=$(date +%s.%N)
    timeout "${GPU_TESTS_S:-210}" python3 -m pytest -m gpu -p no:cacheprovider -q --durations=0 --timeout 100 \
        tests/train/test_gpu_stages.py tests/test_fused_loss.py tests/models/test_packing.py tests/metrics/test_mfu.py \
        tests/train/test_gpu_paths.py >"$OUT/gpu_tests.log" 2>&1
    echo "tests rc=$? in $(seconds "$start") s" | tee -a "$OUT/summary.txt"
fi

if [[ " $parts " == *" stages "* ]]; then
    # The bundled recipes' chain on CUDA, as the README runs it on the CPU: a short SFT start (stopped
    # at 0.4 held-out exact match), then DPO and GRPO from it. Their held-out figures are in metrics.jsonl.
    work=/tmp/gpu-stages
    rm -rf "$work"
    mkdir -p "$work"
    start=$(date +%s.%N)
    timeout "${GPU_STAGES_S:-170}" bash -c "
        set -e
        cd '$work'
        run() { /usr/bin/time -f '%e s wall, %U s user' python3 -m ditty run \"\$@\" --run.device ${GPU_DEVICE:-cuda} --logging.progress false ${GPU_STAGES_ARGS:-}; }
        run tiny_sft --train.stop_when 'val_exact_match >= 0.4' --train.eval_every 25 --run.output_dir '$work/start'
        run tiny_dpo --model.path '$work/start/final' --run.output_dir '$work/dpo'
        run tiny_grpo --model.path '$work/start/final' --run.output_dir '$work/grpo'
    " >"$OUT/stages.log" 2>&1
    echo "stages rc=$? in $(seconds "$start") s" | tee -a "$OUT/summary.txt"
    for run in start dpo grpo; do
        [ -f "$work/$run/metrics.jsonl" ] && cp "$work/$run/metrics.jsonl" "$OUT/stages_$run.jsonl"
    done
fi

if [[ " $parts " == *" bench "* ]]; then
    start=$(date +%s.%N)
    timeout "${GPU_BENCH_S:-150}" python3 tools/bench.py --gpu --quick --only "${GPU_BENCH_ONLY:-eager,compile}" \
        >"$OUT/bench.log" 2>&1
    echo "bench rc=$? in $(seconds "$start") s" | tee -a "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
