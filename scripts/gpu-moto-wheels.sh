#!/usr/bin/env bash
# moto's S3 server for the GPU machine's remote tests (tests/gpu/test_remote_gpu.py skips its S3
# half without it) and s3fs, through which cudf.read_parquet("s3://...") lists a bucket before it
# hands the URLs to libcudf's own KvikIO source: the wheels, cp312, into .gpu/c9/moto (ignored).
# After ../shared/gpu/wheels.sh --cudf; then, in the call that carries .gpu/c9:
#     bash .gpu/install.sh && python3 -m pip install -q --no-index --no-deps --no-compile \
#         --target /tmp/site .gpu/c9/moto/*.whl
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[[ -d .gpu/c9 ]] || { echo "no .gpu/c9: run ../shared/gpu/wheels.sh --cudf first" >&2; exit 1; }
all=$(mktemp -d)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$all" "moto[server]==5.2.5" "s3fs==2026.9.0" "fsspec==2026.9.0"
# what the S3 server needs of it (the rest, CloudFormation linting and such, stays behind: one
# device call carries 64 MiB)
keep="moto boto3 botocore s3transfer jmespath urllib3 python_dateutil six cryptography cffi
pycparser requests idna certifi charset_normalizer responses pyyaml werkzeug markupsafe xmltodict
jinja2 flask flask_cors itsdangerous blinker click py_partiql_parser
s3fs fsspec aiobotocore aiohttp aiohappyeyeballs aioitertools aiosignal attrs frozenlist multidict
propcache wrapt yarl"
rm -rf .gpu/c9/moto && mkdir -p .gpu/c9/moto
for name in $keep; do cp "$all"/"${name}"-[0-9]*.whl .gpu/c9/moto/; done
rm -rf "$all"
du -sh .gpu/c9 .gpu/c9/moto
