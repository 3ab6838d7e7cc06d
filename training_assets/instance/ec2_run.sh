#!/usr/bin/env bash
# One training run on a GPU instance launched from the TrainingStack's launch template (the user data calls this
# after unpacking training_assets/instance/ and inference_assets/ into the current folder). Every node of one
# `aws ec2 run-instances --count N` call runs it; the nodes find each other through their shared reservation:
#
#   1. count the instances of this reservation (N nodes) and pick the rendezvous node (lowest private IP);
#   2. log in to the regional DLC registry and build the training image from training_assets/instance/Dockerfile;
#   3. fetch the dataset and base model when they are S3 URIs (else the script loads them from the hub);
#   4. run launch_training.sh (torchrun, one process per GPU, c10d rendezvous and EFA on several nodes),
#      streaming the container's output to CloudWatch Logs;
#   5. on the node that ran rank 0: package saved_model/ into model.tar.gz (in the image, no AWS calls) and upload
#      it with metrics.json from the host to s3://$ARTIFACTS_BUCKET/$OUTPUT_PREFIX<reservation id>/ (SSE-KMS with
#      $KMS_KEY_ID).
#
# Settings come from the environment the user data exports:
#   AWS_REGION DLC_ACCOUNT REGISTRY_DOMAIN IMAGE_TAG LOG_GROUP ARTIFACTS_BUCKET OUTPUT_PREFIX KMS_KEY_ID
#   DATASET (s3://... folder, or hub NAME[:CONFIG]) BASE_MODEL (s3://... folder or hub id) EFA (true|false)
#   TRAIN_ARGS (hyper-parameter flags of train_sentiment.py)
#   PACKAGE_ARGS (extra flags of inference_assets.tools.package_model: --vendor when the endpoint takes vendored deps)
set -euo pipefail

: "${AWS_REGION:?}" "${DLC_ACCOUNT:?}" "${REGISTRY_DOMAIN:?}" "${IMAGE_TAG:?}" "${LOG_GROUP:?}"
: "${ARTIFACTS_BUCKET:?}" "${OUTPUT_PREFIX:?}" "${KMS_KEY_ID:?}" "${DATASET:?}" "${BASE_MODEL:?}" "${EFA:?}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
PACKAGE_ARGS="${PACKAGE_ARGS:-}"
RDZV_PORT=29500
IMAGE=sentiment-training:latest
WORK="$(pwd)"

imds() {
  local token
  token="$(curl -sf -X PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')"
  curl -sf -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"
}

instance_id="$(imds instance-id)"
reservation="$(imds reservation-id)"
my_ip="$(imds local-ipv4)"

# --- 1. the nodes of this run ------------------------------------------------------------------------------------
mapfile -t peers < <(aws ec2 describe-instances --region "$AWS_REGION" \
  --filters "Name=reservation-id,Values=$reservation" "Name=instance-state-name,Values=pending,running" \
  --query 'Reservations[].Instances[].PrivateIpAddress' --output text | tr '\t' '\n' | sed '/^$/d' | sort -V)
nodes="${#peers[@]}"
((nodes >= 1)) || { echo "no instance found for reservation $reservation" >&2; exit 1; }
echo "run $reservation: $nodes node(s) ${peers[*]}; this node $instance_id $my_ip"
launch_args=(--nnodes "$nodes" --log-group "$LOG_GROUP" --log-stream "$reservation/$instance_id/train"
  --output-dir "$WORK/output")
if ((nodes > 1)); then
  launch_args+=(--rdzv-endpoint "${peers[0]}:$RDZV_PORT" --rdzv-id "$reservation")
fi
[[ "$EFA" == true ]] && launch_args+=(--efa)

# --- 2. the training image ---------------------------------------------------------------------------------------
registry="$DLC_ACCOUNT.dkr.ecr.$AWS_REGION.$REGISTRY_DOMAIN"
aws ecr get-login-password --region "$AWS_REGION" | docker login --username AWS --password-stdin "$registry"
docker build -t "$IMAGE" --build-arg "DLC_ACCOUNT=$DLC_ACCOUNT" --build-arg "REGION=$AWS_REGION" \
  --build-arg "REGISTRY_DOMAIN=$REGISTRY_DOMAIN" --build-arg "BASE_TAG=$IMAGE_TAG" training_assets/instance/

# --- 3. inputs ---------------------------------------------------------------------------------------------------
read -r -a train_args <<<"$TRAIN_ARGS"
read -r -a package_args <<<"$PACKAGE_ARGS"
if [[ "$DATASET" == s3://* ]]; then
  aws s3 sync --only-show-errors "$DATASET" "$WORK/dataset"
  launch_args+=(--data-dir "$WORK/dataset")
else
  train_args+=(--dataset "${DATASET%%:*}")
  [[ "$DATASET" == *:* ]] && train_args+=(--dataset-config "${DATASET#*:}")
fi
if [[ "$BASE_MODEL" == s3://* ]]; then
  aws s3 sync --only-show-errors "$BASE_MODEL" "$WORK/base_model"
  launch_args+=(--model-dir "$WORK/base_model")
else
  train_args+=(--model "$BASE_MODEL")
fi

# --- 4. training -------------------------------------------------------------------------------------------------
bash training_assets/instance/launch_training.sh --image "$IMAGE" "${launch_args[@]}" -- "${train_args[@]}"

# --- 5. package and upload (only the node of rank 0 holds saved_model/) ------------------------------------------
if [[ -d "$WORK/output/saved_model" ]]; then
  destination="s3://$ARTIFACTS_BUCKET/$OUTPUT_PREFIX$reservation"
  # The container only writes the archive: on its bridge network the metadata hop limit of 1 (launch template)
  # keeps the instance role's credentials from it, so every AWS call runs here on the host.
  docker run --rm -v "$WORK:/work" -w /work "$IMAGE" \
    python -m inference_assets.tools.package_model --model-dir output/saved_model --output output/model.tar.gz \
    "${package_args[@]}"
  for file in model.tar.gz metrics.json; do
    aws s3 cp --only-show-errors --sse aws:kms --sse-kms-key-id "$KMS_KEY_ID" \
      "$WORK/output/$file" "$destination/$file"
  done
  echo "model: $destination/model.tar.gz"
fi
