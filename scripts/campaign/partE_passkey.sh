#!/usr/bin/env bash
# Issue 47 item 1: RESULTS Part E's passkey stage again, with the order-aware probe, in four chunks of four schemes
# x seeds 0-4. Each chunk retrains E.1's models from their command (on the kind of CPU that made them the retrained
# losses equal E.2's to the last digit; on another they are close, not equal: RESULTS E.5) and probes them. Every
# step resumes what it finds: rerun the same command after an interruption.
#
#   W=$(realpath ..)                               # worktrees and run folders beside the checkout
#   git worktree add --detach $W/wt-eval e19f6c3
#   setsid nohup scripts/campaign/partE_passkey.sh $W/wt-eval $W/runs/partE 2 3 4 > partE.log 2>&1 &
#
# Copy this file outside the worktree before running it if you may edit it meanwhile (bash reads it as it runs).
set -euo pipefail
code=$(realpath "$1"); runs=$(realpath -m "$2"); shift 2
export PYTHONPATH=$code TOKENIZERS_PARALLELISM=false
cd "$code"
for k in "$@"; do
  # the chunk's schemes, as the GPU studies and RESULTS E.1 cut them
  schemes=$(python -c "from tupe.bench.gpu_studies import length_chunks; print(','.join(length_chunks()[$k - 1]))")
  out=$runs/length-$k
  echo "$(date -u +%FT%TZ) chunk $k ($schemes): train"
  OMP_NUM_THREADS=1 python -m tupe.comparison.study --out "$out" --schemes "$schemes" --seeds 0,1,2,3,4 \
    --stages train --parallel 2 --resume --no-progress
  echo "$(date -u +%FT%TZ) chunk $k: passkey, summary"
  OMP_NUM_THREADS=2 python -m tupe.comparison.study --out "$out" --schemes "$schemes" --seeds 0,1,2,3,4 \
    --stages passkey,summary --resume --no-progress
  echo "$(date -u +%FT%TZ) chunk $k: done"
done
