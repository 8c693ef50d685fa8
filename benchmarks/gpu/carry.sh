#!/usr/bin/env bash
# Wheels the GPU image lacks, for the parts of tupe that import them (docs/benchmarks.md, "GPU: what to carry"):
# datasets (+ dill, multiprocess: `tupe glue`, `tupe finetune`, corpora from parquet/JSON), seqeval (NER metrics),
# sacremoses (the fairseq tokenizer). The GPU suite itself (benchmarks/gpu/run.sh) needs none of them.
#   benchmarks/gpu/carry.sh [DEST=.whl] [PYTHON_VERSION=3.12]     # here, with the package registry reachable
# There, before the command:   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#                              export PYTHONPATH=/tmp/site
set -euo pipefail
dest="${1:-.whl}"
py="${2:-3.12}"
mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dest" "datasets>=3.0" "dill<0.4.2,>=0.3.0" "multiprocess<0.70.20" "sacremoses>=0.0.53"
python3 -m pip wheel -q --no-deps -w "$dest" "seqeval>=1.2"  # seqeval is published as a source archive only
ls -1 "$dest"
