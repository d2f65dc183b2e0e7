#!/usr/bin/env bash
# The public corpus of unusual Parquet files (apache/parquet-testing: Impala, Spark, parquet-mr,
# Arrow and Rust writers) into .corpus/parquet-testing, for tests/test_parquet_corpus.py (host
# target against pyarrow) and tests/gpu/test_parquet_corpus_gpu.py (device against cuDF). Both
# skip, saying so, where the folder is missing. A git URL or a local clone can be given:
#
#     scripts/parquet-corpus.sh [https://github.com/apache/parquet-testing]
#
# The GPU machine reaches no network: fetch here and carry .corpus with the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
source=${1:-https://github.com/apache/parquet-testing}
dest=.corpus/parquet-testing
rm -rf "$dest" && mkdir -p .corpus
if [[ -d $source/.git || -f $source/HEAD ]]; then        # a clone, or a bare repository
  git --git-dir="$( [[ -d $source/.git ]] && echo "$source/.git" || echo "$source")" \
    archive --format=tar HEAD data | (mkdir -p "$dest" && tar -x -C "$dest")
else
  git clone -q --depth 1 "$source" "$dest"
fi
echo "$(ls "$dest"/data/*.parquet | wc -l) Parquet files in $dest/data"
