#!/usr/bin/env bash
# One training run on a GPU instance launched from the TrainingStack's launch template (the user data calls this
# after unpacking training_assets/instance/ and inference_assets/ into the current folder). Every node of one
# `aws ec2 run-instances --count N` call runs it; the nodes find each other through their shared reservation:
#
#   1. list the instances of this reservation (N nodes, in private-IP order: the first is the rendezvous node), the
#      run id (the instance tag training-run-id, the launcher's run_name) and the launch's training arguments (the tag
#      training-run-args); wait for the launcher's record of this launch (s3://$ARTIFACTS_BUCKET/$OUTPUT_PREFIX<run
#      id>/launches/<reservation>.json) to name this instance, and read from the run's records which instances wrote
#      it before (run_lineage.py). This instance writes only its own folder of the run, <run>/nodes/<writer>/ (the
#      writer is INSTANCE_ROLE_ID:<instance id>, the session's aws:userid, which the instance role's policy requires);
#   2. get the training image: pull the digest the platform's pipeline built and promoted (TRAINING_IMAGE_URI), or,
#      where none is configured, log in to the regional DLC registry and build training_assets/instance/Dockerfile;
#   3. stage the inputs where the instance has room to read them fast (its NVMe instance storage, /opt/dlami/nvme on
#      the DLAMI, when LOCAL_NVME is true; else the root volume): the dataset and base model when they are S3 URIs
#      (else the script loads them from the hub), and the newest complete checkpoint the run's writers uploaded, if any;
#   4. run launch_training.sh: the nodes meet at a barrier (bounded by RENDEZVOUS_TIMEOUT seconds; a missing node
#      stops every node with one line naming it), then torchrun (one process per GPU, c10d rendezvous, EFA on several
#      nodes, MAX_RESTARTS worker restarts), streaming the container's output to CloudWatch Logs; meanwhile the
#      rendezvous node uploads each new complete checkpoint to <run>/nodes/<writer>/checkpoints/ (SSE-KMS with
#      $KMS_KEY_ID); TorchInductor's cache (compiled kernels) lives in <run>/nodes/<writer>/compile-cache/: every node
#      restores the run's writers' caches before training, and the rendezvous node uploads what is new every
#      COMPILE_CACHE_UPLOAD_SECONDS and when training ends, so a relaunch of the run skips the compiles of the attempt
#      before (compile_cache_upload below);
#   5. on the node that ran rank 0: package saved_model/ into model.tar.gz (in the image, no AWS calls) and upload
#      it with metrics.json and model.tar.gz.sha256 (its SHA-256, which promotion checks) from the host to
#      <run>/nodes/<writer>/ (SSE-KMS with $KMS_KEY_ID), each written once (If-None-Match: the instance role may not
#      replace them; no other instance may write that folder at all). A run one of whose writers wrote its
#      model.tar.gz is finished: launching it again stops at step 1.
#
# Before any container starts, the host rejects the containers' packets to the instance metadata service (0 below):
# no container holds the instance role's credentials, on the bridge network or the host's.
#
# Settings come from the environment the user data exports:
#   AWS_REGION DLC_ACCOUNT REGISTRY_DOMAIN DLC_REPOSITORY IMAGE_TAG (the training DLC, as platform_facts/images.json
#   names it) LOG_GROUP ARTIFACTS_BUCKET OUTPUT_PREFIX KMS_KEY_ID INSTANCE_ROLE_ID (the instance role's unique id)
#   DATASET (s3://... folder, or hub NAME[:CONFIG]) BASE_MODEL (s3://... folder or hub id) EFA (true|false)
#   TRAIN_ARGS (hyper-parameter flags of train_sentiment.py)
#   TRAINING_IMAGE_URI (optional: the pipeline-built image by digest) LOCAL_NVME (true|false, default false)
#   RENDEZVOUS_TIMEOUT (seconds, default 600) MAX_RESTARTS (default 0) CHECKPOINT_UPLOAD_SECONDS (default 60)
#   COMPILE_CACHE_UPLOAD_SECONDS (default 300) LAUNCH_RECORD_SECONDS (how long to wait for the launcher's record,
#   default 300)
set -euo pipefail

: "${AWS_REGION:?}" "${DLC_ACCOUNT:?}" "${REGISTRY_DOMAIN:?}" "${DLC_REPOSITORY:?}" "${IMAGE_TAG:?}"
: "${LOG_GROUP:?}" "${ARTIFACTS_BUCKET:?}" "${OUTPUT_PREFIX:?}" "${KMS_KEY_ID:?}" "${DATASET:?}" "${BASE_MODEL:?}"
: "${EFA:?}" "${INSTANCE_ROLE_ID:?}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
TRAINING_IMAGE_URI="${TRAINING_IMAGE_URI:-}"
LOCAL_NVME="${LOCAL_NVME:-false}"
NVME_MOUNT="${NVME_MOUNT:-/opt/dlami/nvme}"  # where the DLAMI mounts the instance's NVMe storage (release notes)
RENDEZVOUS_TIMEOUT="${RENDEZVOUS_TIMEOUT:-600}"
MAX_RESTARTS="${MAX_RESTARTS:-0}"
CHECKPOINT_UPLOAD_SECONDS="${CHECKPOINT_UPLOAD_SECONDS:-60}"
COMPILE_CACHE_UPLOAD_SECONDS="${COMPILE_CACHE_UPLOAD_SECONDS:-300}"
LAUNCH_RECORD_SECONDS="${LAUNCH_RECORD_SECONDS:-300}"
RUN_ID_TAG=training-run-id
RUN_ARGS_TAG=training-run-args
RDZV_PORT=29500
WORK="$(pwd)"
# The training and packaging containers run as this uid:gid (launch_training.sh), never as root.
export CONTAINER_USER="${CONTAINER_USER:-2000:2000}"
IMDS_ADDRESS=169.254.169.254

# --- 0. no container reaches the instance metadata service ---------------------------------------------------------
# Host-network containers (multi-node and EFA runs) send from the host's own stack: their sockets belong to the
# container's uid, which the OUTPUT rule rejects. Bridge-network containers (single node, image builds) are forwarded
# from docker0 through DOCKER-USER, Docker's chain for its users' rules (Docker docs, "Packet filtering and
# firewalls"); the launch template's hop limit of 1 stops them too. The container has no capabilities to undo this.
iptables -w -N DOCKER-USER 2>/dev/null || true
iptables -w -I DOCKER-USER -d "$IMDS_ADDRESS/32" -j REJECT
iptables -w -I OUTPUT -d "$IMDS_ADDRESS/32" -m owner --uid-owner "${CONTAINER_USER%%:*}" -j REJECT

imds() {
  local token
  token="$(curl -sf -X PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')"
  curl -sf -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"
}

# TorchInductor's cache of this run, kept in S3 under the run's own prefix: restored on every node before training,
# uploaded by the rendezvous node while it trains (what is new, every COMPILE_CACHE_UPLOAD_SECONDS: the first steps'
# compiles survive a node lost later) and once more after. Never shared between runs: the cache holds compiled code
# (shared libraries, Triton kernels) that the training processes load and run, so only this run's instances write
# what it loads.
compile_cache_upload() {
  aws s3 sync --only-show-errors --sse aws:kms --sse-kms-key-id "$KMS_KEY_ID" "$STAGE/compile-cache" \
    "$destination/compile-cache/"
}

instance_id="$(imds instance-id)"
reservation="$(imds reservation-id)"
my_ip="$(imds local-ipv4)"

# --- 1. the nodes of this run, and its id ------------------------------------------------------------------------
# One row per instance: private IP, instance id, run-id tag, run-arguments tag (None when the launch set none); in
# private-IP order. The platform's launcher sets both tags from validated inputs (stacks/components/training_launcher).
mapfile -t rows < <(aws ec2 describe-instances --region "$AWS_REGION" \
  --filters "Name=reservation-id,Values=$reservation" "Name=instance-state-name,Values=pending,running" \
  --query "Reservations[].Instances[].[PrivateIpAddress,InstanceId,Tags[?Key=='$RUN_ID_TAG']|[0].Value,Tags[?Key=='$RUN_ARGS_TAG']|[0].Value]" \
  --output text | sed '/^[[:space:]]*$/d' | sort -V)
nodes=()
run_id=""
run_args=""
for row in "${rows[@]}"; do
  IFS=$'\t' read -r ip id tag args <<<"$row"
  nodes+=("$id@$ip")
  if [[ "$id" == "$instance_id" && -n "$tag" && "$tag" != None ]]; then run_id="$tag"; fi
  if [[ "$id" == "$instance_id" && -n "$args" && "$args" != None ]]; then run_args="$args"; fi
done
# The launcher writes only flags of train_sentiment.py with numbers; anything else is refused here too.
[[ -z "$run_args" || "$run_args" =~ ^(--[a-z-]+\ [0-9][0-9.e+-]*( |$))+$ ]] || {
  echo "tag $RUN_ARGS_TAG='$run_args': only '--flag number' pairs (the launcher writes them)" >&2; exit 1; }
count="${#nodes[@]}"
((count >= 1)) || { echo "no instance found for reservation $reservation" >&2; exit 1; }
[[ "$run_id" =~ ^[A-Za-z0-9._-]{1,64}$ ]] || {
  echo "tag $RUN_ID_TAG='$run_id': use 1-64 letters, digits, . _ - (the platform's launcher sets it)" >&2; exit 1; }
me="$instance_id@$my_ip"
first_ip="${nodes[0]#*@}"
echo "run $run_id (reservation $reservation): $count node(s) ${nodes[*]}; this node $me"
# This instance's own folder of the run: the only place its role may write (the session's aws:userid).
writer="$INSTANCE_ROLE_ID:$instance_id"
run_uri="s3://$ARTIFACTS_BUCKET/$OUTPUT_PREFIX$run_id/"
destination="${run_uri}nodes/$writer"
# Wait for the launcher's record of this launch; the run's writers (whose folders it resumes from); a finished run
# (one of its writers wrote the candidate) stops here with one line.
joined="$(python3 training_assets/instance/run_lineage.py --run "$run_uri" join --reservation "$reservation" \
  --writer "$writer" --timeout "$LAUNCH_RECORD_SECONDS")"
mapfile -t writers <<<"$joined"

# --- 2. the training image ---------------------------------------------------------------------------------------
if [[ -n "$TRAINING_IMAGE_URI" ]]; then
  # <account>.dkr.ecr.<region>.<domain>/<repository>@sha256:...: the pipeline's registry, maybe in another region.
  registry="${TRAINING_IMAGE_URI%%/*}"
  registry_region="$(cut -d. -f4 <<<"$registry")"
  echo "training image: $TRAINING_IMAGE_URI (built and promoted by the platform's pipeline; every node pulls it)"
  aws ecr get-login-password --region "$registry_region" | docker login --username AWS --password-stdin "$registry"
  docker pull --quiet "$TRAINING_IMAGE_URI"
  IMAGE="$TRAINING_IMAGE_URI"
else
  echo "training image: no pipeline-built image is configured (training.image_registry_account is not set):" \
    "building training_assets/instance/Dockerfile on this node"
  IMAGE=sentiment-training:latest
  registry="$DLC_ACCOUNT.dkr.ecr.$AWS_REGION.$REGISTRY_DOMAIN"
  aws ecr get-login-password --region "$AWS_REGION" | docker login --username AWS --password-stdin "$registry"
  docker build -t "$IMAGE" --build-arg "DLC_ACCOUNT=$DLC_ACCOUNT" --build-arg "REGION=$AWS_REGION" \
    --build-arg "REGISTRY_DOMAIN=$REGISTRY_DOMAIN" --build-arg "DLC_REPOSITORY=$DLC_REPOSITORY" \
    --build-arg "BASE_TAG=$IMAGE_TAG" training_assets/instance/
fi

# --- 3. inputs, on NVMe where the instance has it -----------------------------------------------------------------
STAGE="$WORK"
if [[ "$LOCAL_NVME" == true ]]; then
  if mountpoint -q "$NVME_MOUNT"; then
    STAGE="$NVME_MOUNT/sentiment-training"
    echo "staging the data, checkpoints and output on the instance's NVMe storage ($NVME_MOUNT)"
  else
    echo "warning: the instance type has NVMe storage but $NVME_MOUNT is not mounted: staging on the root volume"
  fi
fi
OUT="$STAGE/output"
mkdir -p "$OUT"
launch_args=(--nnodes "$count" --log-group "$LOG_GROUP" --log-stream "$reservation/$instance_id/train"
  --output-dir "$OUT" --max-restarts "$MAX_RESTARTS")
if ((count > 1)); then
  launch_args+=(--rdzv-endpoint "$first_ip:$RDZV_PORT" --rdzv-id "$run_id" --nodes "$(IFS=,; echo "${nodes[*]}")"
    --node "$me" --rendezvous-timeout "$RENDEZVOUS_TIMEOUT")
fi
[[ "$EFA" == true ]] && launch_args+=(--efa)
# The launch's arguments come after the environment's, so argparse takes theirs.
read -r -a train_args <<<"$TRAIN_ARGS $run_args"
if [[ "$DATASET" == s3://* ]]; then
  aws s3 sync --only-show-errors "$DATASET" "$STAGE/dataset"
  launch_args+=(--data-dir "$STAGE/dataset")
else
  train_args+=(--dataset "${DATASET%%:*}")
  [[ "$DATASET" == *:* ]] && train_args+=(--dataset-config "${DATASET#*:}")
fi
if [[ "$BASE_MODEL" == s3://* ]]; then
  aws s3 sync --only-show-errors "$BASE_MODEL" "$STAGE/base_model"
  launch_args+=(--model-dir "$STAGE/base_model")
else
  train_args+=(--model "$BASE_MODEL")
fi
# The newest complete checkpoint the run's writers uploaded (a run launched again resumes from it, reading the folders
# of its earlier instances; train_sentiment.py decides). This node uploads into its own folder only.
checkpoints=(python3 training_assets/instance/checkpoint_sync.py --local "$OUT/checkpoints"
  --s3 "$destination/checkpoints/" --kms-key-id "$KMS_KEY_ID")
earlier=()
for other in "${writers[@]}"; do earlier+=(--from "${run_uri}nodes/$other/checkpoints/"); done
"${checkpoints[@]:0:2}" restore "${checkpoints[@]:2}" "${earlier[@]}"
mkdir -p "$STAGE/compile-cache"
for other in "${writers[@]}"; do
  aws s3 sync --only-show-errors "${run_uri}nodes/$other/compile-cache/" "$STAGE/compile-cache"
done
launch_args+=(--compile-cache-dir "$STAGE/compile-cache")

# --- 4. training (the rendezvous node uploads the checkpoints meanwhile) ------------------------------------------
uploader=""
cache_uploader=""
if [[ "$me" == "${nodes[0]}" ]]; then
  "${checkpoints[@]:0:2}" upload "${checkpoints[@]:2}" --watch "$CHECKPOINT_UPLOAD_SECONDS" &
  uploader=$!
  # (The sleep holds none of this script's streams: it may outlive the loop it belongs to by up to one period.)
  while sleep "$COMPILE_CACHE_UPLOAD_SECONDS" </dev/null >/dev/null 2>&1; do compile_cache_upload || true; done &
  cache_uploader=$!
fi
status=0
bash training_assets/instance/launch_training.sh --image "$IMAGE" "${launch_args[@]}" -- "${train_args[@]}" || status=$?
if [[ -n "$uploader" ]]; then
  kill -TERM "$uploader" 2>/dev/null || true  # it finishes the upload under way (and uploads once more), then stops
  wait "$uploader" || true
  # The last upload runs here, once the uploader has stopped: a TERM that reaches it before its interpreter has set
  # its handler (a run that fails within its first moments) ends it without that upload. S3 holding the checkpoint
  # already, this only lists the slots.
  "${checkpoints[@]:0:2}" upload "${checkpoints[@]:2}" || echo "warning: the last checkpoint upload failed" >&2
fi
if [[ -n "$cache_uploader" ]]; then
  # A sync cut short by the stop, or still running beside the last one, uploads the same files: harmless.
  kill -TERM "$cache_uploader" 2>/dev/null || true
  wait "$cache_uploader" 2>/dev/null || true
  compile_cache_upload || echo "warning: the compile cache upload failed" >&2
fi
if [[ -f "$OUT/rendezvous.json" ]]; then  # the rendezvous node's record of when the nodes started
  aws s3 cp --only-show-errors --sse aws:kms --sse-kms-key-id "$KMS_KEY_ID" "$OUT/rendezvous.json" \
    "$destination/rendezvous.json"
fi
if ((status != 0)); then
  echo "training failed (exit status $status); to resume from its newest complete checkpoint" \
    "($destination/checkpoints/), launch again with run_name $run_id" >&2
  exit "$status"
fi

# --- 5. package and upload (only the node of rank 0 holds saved_model/) ------------------------------------------
if [[ -d "$OUT/saved_model" ]]; then
  # The container only writes the archive: on its bridge network the metadata hop limit of 1 (launch template)
  # keeps the instance role's credentials from it, so every AWS call runs here on the host.
  docker run --rm --user "$CONTAINER_USER" --security-opt no-new-privileges -e HOME=/tmp \
    -v "$WORK:/work" -v "$OUT:/work/output" -w /work "$IMAGE" \
    python -m inference_assets.tools.package_model --model-dir output/saved_model --output output/model.tar.gz
  # The digest promotion checks (ModelArchiveCheck, inference_assets/tools/model_check.py), recorded as the run writes
  # the archive, in the folder only this instance may write.
  (cd "$OUT" && sha256sum model.tar.gz >model.tar.gz.sha256)
  for file in model.tar.gz metrics.json model.tar.gz.sha256; do
    # Written once: S3 refuses the write if the key exists (412), and the instance role may write these keys only so.
    aws s3api put-object --bucket "$ARTIFACTS_BUCKET" --key "$OUTPUT_PREFIX$run_id/nodes/$writer/$file" \
      --body "$OUT/$file" --if-none-match '*' --server-side-encryption aws:kms --ssekms-key-id "$KMS_KEY_ID" >/dev/null
  done
  echo "model: $destination/model.tar.gz (sha256 $(cut -d' ' -f1 "$OUT/model.tar.gz.sha256"))"
fi
