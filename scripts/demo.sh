#!/bin/bash
# The smallest real run: tokenise the shipped tinyshakespeare text (bytes,
# vocab 256), train a 4-layer Llama on 2 CPU cores, print samples, write a
# checkpoint and export it as a Hugging Face folder, and plot the metrics.
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
if [ ! -f data/build/tinyshakespeare_train.bin ]; then
    $PY scripts/prepare_data.py --input data/tinyshakespeare.txt --text-docs paragraphs --out-dir data/build --name tinyshakespeare
fi
# a demo trains from scratch each time (a real job resumes by itself: checkpoint.resume=auto)
./llmtrain configs/shakespeare_llama.json --set checkpoint.resume=none "$@"
./llmtrain export runs/shakespeare_llama/checkpoints runs/shakespeare_llama/hf
$PY scripts/plot_metrics.py runs/shakespeare_llama/metrics.jsonl --out runs/shakespeare_llama/metrics.png
echo "metrics: runs/shakespeare_llama/metrics.jsonl, plot: runs/shakespeare_llama/metrics.png, model: runs/shakespeare_llama/hf"
