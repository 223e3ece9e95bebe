#!/usr/bin/env bash
# A local S3 server (moto, from the dev extra), a run of 20 steps that uploads its checkpoints and
# deletes the local copies, then a restart that resumes from the bucket and finishes the 40 steps.
# OUT is the run folder (default outputs/example-s3); extra arguments (--section.key value) go
# to both runs. --tiny (first): the same in 4 steps of a one-block model, saving at steps 2 and 4.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/lib.sh
export CONFIG_FILE=examples/s3/config.toml NPROC=${NPROC:-1}
OUT=${OUT:-outputs/example-s3}
STOP=20 END=40
if [[ "${1:-}" == --tiny ]]; then
    shift
    STOP=2 END=4
    set -- "${TINY[@]}" --checkpoint.interval 2 --metrics.log_freq 2 --lr_scheduler.warmup_steps 1 "$@"
fi

# moto accepts any credentials; against a real store, boto3 reads them from the usual places.
export AWS_ACCESS_KEY_ID=example AWS_SECRET_ACCESS_KEY=example AWS_DEFAULT_REGION=us-east-1
PORT=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
ENDPOINT="http://127.0.0.1:$PORT"
python -m moto.server -H 127.0.0.1 -p "$PORT" > /dev/null 2>&1 &
SERVER=$!
trap 'kill "$SERVER"' EXIT
python - "$ENDPOINT" <<'PY'
import sys, time, boto3
for _ in range(150):  # wait for the server, then make the bucket
    try:
        boto3.client("s3", endpoint_url=sys.argv[1]).create_bucket(Bucket="kenotron-example")
        break
    except Exception:
        time.sleep(0.2)
else:
    sys.exit(f"no S3 server answered at {sys.argv[1]}")
PY

RUN=(--job.dump_folder "$OUT" --checkpoint.remote_endpoint_url "$ENDPOINT")
train "${RUN[@]}" --training.steps "$STOP" "$@"  # uploads step 20, then deletes the local copy
train "${RUN[@]}" --training.steps "$END" "$@"   # downloads step 20 and trains to step 40
python - "$ENDPOINT" <<'PY'
import sys, boto3
listing = boto3.client("s3", endpoint_url=sys.argv[1]).list_objects_v2(Bucket="kenotron-example")
steps = sorted({o["Key"].split("/")[1] for o in listing.get("Contents", []) if "COMPLETE" in o["Key"]})
print("complete checkpoints in s3://kenotron-example/debug-run:", ", ".join(steps))
PY
