#!/usr/bin/env bash
# The GPU benchmark suite (docs/benchmarks.md, "GPU"): run from the repository root on a machine with a GPU.
#   benchmarks/gpu/run.sh --out DIR [--budget 540] [--stages cuda-tests,steps,profile,long,end-to-end] [--archive F]
#   benchmarks/gpu/run.sh --out DIR --stages studies,packing-speed --studies packing,length-1 ...   # the open issues' GPU work
# Every option: benchmarks/gpu/run.sh --help (tupe/bench/gpu_suite.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "${PYTHON:-python3}" -m tupe.bench.gpu_suite "$@"
