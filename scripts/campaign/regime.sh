#!/usr/bin/env bash
# Issue 47 item 3: the paper's four schemes at the regime recipe (RESULTS G.3-G.4, H) and everything queued on them,
# in the order RESULTS G.4 gives. Every step resumes what it finds, so after an interruption (a session's end) the
# same command goes on; a step already done costs seconds.
#
#   W=$(realpath ..)                               # worktrees and run folders beside the checkout
#   git worktree add --detach $W/wt-pre e1cb602     # the pre-training code of every G.4 run
#   git worktree add --detach $W/wt-reg COMMIT      # the evaluation code: the commit that added this script or later
#   setsid nohup scripts/campaign/regime.sh $W/wt-pre $W/wt-reg $W/runs/paper6k \
#       DATA/glue DATA/conll2003/train.txt > regime.log 2>&1 &
#
# On the kind of CPU that made them the runs reproduce the committed curves (docs/results/regime/paper6k/claims.json)
# to the last digit; on another (AVX2 against AVX-512) they start equal and drift apart (RESULTS H.2): `claims
# --against` shows where. Two jobs at a time, one thread each. Copy this file outside the worktree before running
# it if you may edit it meanwhile.
set -euo pipefail
pre=$(realpath "$1"); code=$(realpath "$2"); study=$(realpath -m "$3"); glue=$(realpath "$4")
conll=$(realpath "$5")
schemes=bert-a,tupe-a,tupe-r,bert-r
mkdir -p "$study"
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
say() { echo "$(date -u +%FT%TZ) $*"; }

say "pre-training: $schemes x seeds 0-2, 6,000 steps (code $(git -C "$pre" rev-parse --short HEAD))"
(cd "$pre" && PYTHONPATH=$pre python -m tupe compare --schemes $schemes --seeds 0,1,2 --preset small \
  --max-steps 6000 --parallel 2 --threads 1 --no-progress --resume --out "$study/runs")

cd "$code"
export PYTHONPATH=$code
git rev-parse HEAD > "$study/eval.commit"
record=$code/docs/results/regime/paper6k/claims.json
say "the retrained curves against the committed record (claims.md: 'Against the record')"
steps=1000,2000,3000,4000,5000,6000  # the steps claims tables, as for the committed record
python -m tupe.comparison.claims "$study" --steps $steps --against "$record" > /dev/null
texts=$study/texts
mkdir -p "$texts"
[ -s "$texts/conll-news.txt" ] || python benchmarks/texts/conll_news.py "$conll" "$texts/conll-news.txt"
[ -s "$texts/mnli_premises.txt" ] || python - "$glue/MNLI/subset/train_subset.json" "$texts/mnli_premises.txt" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1], encoding="utf-8")).values()
premises = dict.fromkeys(r["text_a"].strip() for r in rows)  # distinct, in the file's order
open(sys.argv[2], "w", encoding="utf-8").write("\n\n".join(premises) + "\n")
PY
S=(--out "$study" --schemes $schemes --seeds 0,1,2 --preset small --max-steps 6000)
T=(--ood-text "$texts/conll-news.txt" --ood-text "$texts/mnli_premises.txt")

say "evaluation stages: out of domain, lengths, passkey (order-aware)"
OMP_NUM_THREADS=2 python -m tupe.comparison.study "${S[@]}" --stages ood,lengths,passkey,summary --resume \
  --no-progress "${T[@]}"

say "GLUE CoLA, MRPC: whole training sets, the small-model grid x fine-tuning seeds 1-5"
python -m tupe.comparison.study "${S[@]}" --stages glue,summary --resume --no-progress "${T[@]}" --parallel 2 \
  --glue-data "$glue" --glue-tasks CoLA,MRPC --glue-train-samples all --glue-seeds 1,2,3,4,5

say "diagnostics (Part F's tasks) fine-tuned from each model"
models=()
for s in ${schemes//,/ }; do for k in 0 1 2; do models+=("$study/runs/$s/seed-$k"); done; done
python -m tupe diagnose --out "$study/diag" --model "${models[@]}" --seeds 0 --parallel 2 --resume --no-progress

# one `tupe glue` grid a job, two jobs at a time; a grid with results.json is done
grid() {  # grid OUT tupe-glue-args...
  local out=$1; shift
  [ -s "$out/results.json" ] && return 0
  python -m tupe glue --out "$out" --seeds 1,2,3,4,5 --threads 1 --no-progress "$@" \
    > "$out.log" 2>&1 || { say "failed: $out (see $out.log)"; return 1; }
}
pairs() {  # runs the queued grids two at a time, then waits
  local pids=() status=0
  while read -r line; do
    [ -z "$line" ] && continue
    eval "grid $line" & pids+=($!)
    if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  return $status
}
mkdir -p "$study/glue"
say "Table 1's 30% rows: CoLA, MRPC of tupe-a, tupe-r at checkpoint-1750"
for t in CoLA MRPC; do for s in tupe-a tupe-r; do for k in 0 1 2; do
  echo "$study/glue/$t-$s-mid-seed-$k --model $study/runs/$s/seed-$k/checkpoint-1750 --tokenizer $study/runs/$s/seed-$k --task $t --data-dir $glue"
done; done; done | pairs || true

say "SST-2 (one learning rate, 1e-4) and the MNLI sample"
for k in 0 1 2; do for s in ${schemes//,/ }; do
  echo "$study/glue/SST-2-$s-seed-$k --model $study/runs/$s/seed-$k --task SST-2 --data-dir $glue --lrs 1e-4"
done; done | pairs || true
for k in 0 1 2; do for s in ${schemes//,/ }; do
  echo "$study/glue/MNLI-$s-seed-$k --model $study/runs/$s/seed-$k --task MNLI --lrs 1e-4 \
--train-file $glue/MNLI/subset/train_subset.json --dev-file $glue/MNLI/subset/heldout_subset.json"
done; done | pairs || true

say "claims"
python -m tupe.comparison.claims "$study" --steps $steps --glue-tasks CoLA,MRPC,SST-2,MNLI --against "$record"
say "done"
