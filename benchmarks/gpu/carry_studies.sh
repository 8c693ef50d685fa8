#!/usr/bin/env bash
# What the GPU suite's `studies` and `packing-speed` stages read that the GPU machine cannot reach, copied into
# .carry/ (ignored by git; name it in the device call's carry list; docs/benchmarks.md, "GPU: the open issues' studies"):
#   .carry/glue/{SST-2,CoLA,MRPC}           train.tsv and dev.tsv of the GLUE root given (the regime study's GLUE,
#                                           SST-2 of the packing study, the padding-free glue step)
#   .carry/conll-news.txt                   the news text of issue 37 (benchmarks/texts/conll_news.py; not shipped)
#   .carry/mnli_premises.txt                Part C's second out-of-domain text, if a file is given (docs/evaluation.md)
#   benchmarks/gpu/carry_studies.sh GLUE_ROOT CONLL_TRAIN_TXT [MNLI_PREMISES_TXT]     # here, before the call
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 2 ]; then
    echo "usage: $0 GLUE_ROOT CONLL_TRAIN_TXT [MNLI_PREMISES_TXT]" >&2
    exit 2
fi
glue="$1"
conll="$2"
mnli="${3:-}"
for task in SST-2 CoLA MRPC; do
    mkdir -p ".carry/glue/$task"
    install -m 0644 "$glue/$task/train.tsv" "$glue/$task/dev.tsv" ".carry/glue/$task/"  # writable: a rerun replaces them
done
"${PYTHON:-python3}" benchmarks/texts/conll_news.py "$conll" .carry/conll-news.txt
if [ -n "$mnli" ]; then
    install -m 0644 "$mnli" .carry/mnli_premises.txt
fi
du -sh .carry
