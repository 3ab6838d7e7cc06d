#!/usr/bin/env bash
# Run training_assets.instance.train_sentiment in the training image with torchrun: one process per GPU, on one node or several.
#
#   launch_training.sh [options] [-- train_sentiment.py arguments]
#
#   --image NAME          image built from training_assets/instance/Dockerfile (default: sentiment-training:latest)
#   --gpus N              processes (GPUs) per node (default: the GPUs nvidia-smi lists)
#   --nnodes N            number of nodes (default: 1); every node runs this script with the same settings
#   --rdzv-endpoint H:P   torchrun c10d rendezvous host:port, the first node's private IP (needed when --nnodes > 1)
#   --rdzv-id ID          run id shared by the nodes of one run (default: sentiment)
#   --nodes A,B,...       the run's nodes, the rendezvous node first (needed when --nnodes > 1): they meet at a
#                         barrier on the rendezvous node before torchrun starts (rendezvous.py)
#   --node NAME           this node, as --nodes names it
#   --rendezvous-timeout S  seconds the nodes may start apart: the bound of the barrier and of torchrun's
#                         rendezvous (default: 600); a node missing after it stops the run with one line naming it
#   --max-restarts N      torchrun restarts every worker after one fails, at most N times; with checkpoints they
#                         resume from the newest complete one (default: 0)
#   --efa                 NCCL over EFA (p4d: 4 x 100 Gbit/s): the EFA devices passed through (never --privileged)
#   --data-dir DIR        host folder with the dataset, mounted read-only and passed as --dataset
#   --model-dir DIR       host folder with the base model, mounted read-only and passed as --model
#   --output-dir DIR      host folder that receives metrics.json and saved_model/ (default: ./output)
#   --compile-cache-dir DIR  host folder for TorchInductor's cache (compiled kernels), kept across the restarts of
#                         torchrun and the runs that reuse the folder (ec2_run.sh keeps it in S3 per run)
#   --shm-size SIZE       shared memory for the data loaders (default: 16g)
#   --log-group NAME      send the container's output to this CloudWatch Logs group (docker awslogs driver)
#   --log-stream NAME     stream within --log-group (default: the host name)
#   --dry-run             print the docker command instead of running it
#
# Docker flags follow the AWS DLC and NVIDIA recommendations for deep-learning training: --gpus all --ipc=host
# --shm-size, --ulimit memlock=-1 (pinned memory, NCCL/EFA registration) and --ulimit stack=67108864.
# The container never holds the instance role: it runs as CONTAINER_USER (uid:gid, default 2000:2000), whose packets
# to the instance metadata service ec2_run.sh rejects on the host (iptables owner match; the launch template's hop
# limit of 1 keeps it from bridge-networked containers too), without --privileged and without added capabilities, so
# it cannot change those rules even on the host network.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
fail() { echo "launch_training.sh: error: $*" >&2; exit 2; }

image="sentiment-training:latest"
gpus=""
nnodes=1
rdzv_endpoint=""
rdzv_id="sentiment"
nodes=""
node=""
rendezvous_timeout=600
max_restarts=0
efa=false
data_dir=""
model_dir=""
output_dir="./output"
compile_cache_dir=""
shm_size="16g"
log_group=""
log_stream="$(hostname)"
dry_run=false
train_args=()
container_user="${CONTAINER_USER:-2000:2000}"
efa_devices="${EFA_DEVICE_DIR:-/dev/infiniband}"

while (($#)); do
  case "$1" in
    --image) image="${2:?--image needs a value}"; shift 2 ;;
    --gpus) gpus="${2:?--gpus needs a value}"; shift 2 ;;
    --nnodes) nnodes="${2:?--nnodes needs a value}"; shift 2 ;;
    --rdzv-endpoint) rdzv_endpoint="${2:?--rdzv-endpoint needs a value}"; shift 2 ;;
    --rdzv-id) rdzv_id="${2:?--rdzv-id needs a value}"; shift 2 ;;
    --nodes) nodes="${2:?--nodes needs a value}"; shift 2 ;;
    --node) node="${2:?--node needs a value}"; shift 2 ;;
    --rendezvous-timeout) rendezvous_timeout="${2:?--rendezvous-timeout needs a value}"; shift 2 ;;
    --max-restarts) max_restarts="${2:?--max-restarts needs a value}"; shift 2 ;;
    --efa) efa=true; shift ;;
    --data-dir) data_dir="${2:?--data-dir needs a value}"; shift 2 ;;
    --model-dir) model_dir="${2:?--model-dir needs a value}"; shift 2 ;;
    --output-dir) output_dir="${2:?--output-dir needs a value}"; shift 2 ;;
    --compile-cache-dir) compile_cache_dir="${2:?--compile-cache-dir needs a value}"; shift 2 ;;
    --shm-size) shm_size="${2:?--shm-size needs a value}"; shift 2 ;;
    --log-group) log_group="${2:?--log-group needs a value}"; shift 2 ;;
    --log-stream) log_stream="${2:?--log-stream needs a value}"; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    -h|--help) usage ;;
    --) shift; train_args=("$@"); break ;;
    *) fail "unknown option $1 (train_sentiment.py arguments go after --)" ;;
  esac
done

if [[ -z "$gpus" ]]; then
  command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: pass --gpus N"
  gpus="$(nvidia-smi --list-gpus | grep -c '^GPU')"
fi
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || fail "--gpus must be a positive number, got '$gpus'"
[[ "$nnodes" =~ ^[1-9][0-9]*$ ]] || fail "--nnodes must be a positive number, got '$nnodes'"
[[ "$rendezvous_timeout" =~ ^[1-9][0-9]*$ ]] || fail "--rendezvous-timeout must be a positive number of seconds"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || fail "--max-restarts must be 0 or more, got '$max_restarts'"
if ((nnodes > 1)); then
  [[ "$rdzv_endpoint" =~ ^[A-Za-z0-9.-]+:[0-9]+$ ]] || fail "--nnodes $nnodes needs --rdzv-endpoint HOST:PORT"
  IFS=, read -r -a node_list <<<"$nodes"
  ((${#node_list[@]} == nnodes)) || fail "--nnodes $nnodes needs --nodes with $nnodes names, got '$nodes'"
  [[ ",$nodes," == *",$node,"* && -n "$node" ]] || fail "--node must be one of --nodes ($nodes), got '$node'"
fi
for dir in "$data_dir" "$model_dir"; do
  [[ -z "$dir" || -d "$dir" || "$dry_run" == true ]] || fail "folder $dir does not exist"
done
[[ "$container_user" =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] || fail "CONTAINER_USER must be uid:gid other than root, got '$container_user'"
# Docker mounts need absolute paths (a dry run prints folders that do not exist yet as given).
host_path() { if [[ -d "$1" ]]; then (cd "$1" && pwd); else printf '%s' "$1"; fi; }
[[ "$dry_run" == true ]] || mkdir -p "$output_dir"
# The container's user writes the output (on an instance this script runs as root; elsewhere the folder is ours).
if [[ "$dry_run" != true ]] && ((EUID == 0)); then chown -R "$container_user" "$output_dir"; fi

# Not root, no new privileges: HOME and USER for the hub cache and TorchInductor's cache folder (the uid has no
# passwd entry in the image).
docker_cmd=(docker run --rm --gpus all --ipc=host "--shm-size=$shm_size"
  --ulimit memlock=-1 --ulimit stack=67108864
  --user "$container_user" --security-opt no-new-privileges -e HOME=/tmp -e USER=training
  -e TOKENIZERS_PARALLELISM=false)
if ((nnodes > 1)) || [[ "$efa" == true ]]; then
  # torchrun's rendezvous store and NCCL's bootstrap advertise the container's addresses to the other nodes, which
  # reach them only on the host network (Docker's bridge addresses are private to each node).
  docker_cmd+=(--network host)
fi
if [[ "$efa" == true ]]; then
  # libfabric opens the EFA devices (/dev/infiniband/uverbs*); aws-ofi-nccl in the DLC routes NCCL over them. AWS
  # passes them through as devices, not with privileges (AWS Batch User Guide, "Elastic Fabric Adapter": the job's
  # devices name /dev/infiniband/uverbs0 with READ, WRITE, MKNOD), with the memlock ulimit above.
  shopt -s nullglob
  devices=("$efa_devices"/uverbs*)
  shopt -u nullglob
  ((${#devices[@]} > 0)) || fail "--efa: no EFA device under $efa_devices (is the EFA driver loaded?)"
  for device in "${devices[@]}"; do docker_cmd+=(--device "$device"); done
  docker_cmd+=(-e FI_PROVIDER=efa -e FI_EFA_USE_DEVICE_RDMA=1 -e FI_EFA_FORK_SAFE=1)
  # NCCL names the network it chose in its INFO log (a file per process); train_sentiment.py reads it
  # and stops a run that fell back to TCP sockets (--expect-efa).
  docker_cmd+=(-e NCCL_DEBUG=INFO -e NCCL_DEBUG_SUBSYS=INIT,NET -e NCCL_DEBUG_FILE=/tmp/nccl.%h.%p.log)
fi
if [[ -n "$log_group" ]]; then
  docker_cmd+=(--log-driver awslogs --log-opt "awslogs-group=$log_group" --log-opt "awslogs-stream=$log_stream")
fi

# Tokenized splits are shared by the processes of this node, beside the output (on NVMe where ec2_run.sh stages it).
script_args=(--output-dir /opt/ml/output --tokenized-dir /opt/ml/output/tokenized)
[[ "$efa" == true ]] && script_args+=(--expect-efa)
docker_cmd+=(-v "$(host_path "$output_dir"):/opt/ml/output")
if [[ -n "$data_dir" ]]; then
  docker_cmd+=(-v "$(host_path "$data_dir"):/opt/ml/input/data:ro")
  script_args+=(--dataset /opt/ml/input/data)
fi
if [[ -n "$model_dir" ]]; then
  docker_cmd+=(-v "$(host_path "$model_dir"):/opt/ml/input/model:ro")
  script_args+=(--model /opt/ml/input/model)
fi
if [[ -n "$compile_cache_dir" ]]; then
  [[ "$dry_run" == true ]] || mkdir -p "$compile_cache_dir"
  # The container's user writes the kernels it compiles there (root restored the cache from S3).
  if [[ "$dry_run" != true ]] && ((EUID == 0)); then chown -R "$container_user" "$compile_cache_dir"; fi
  docker_cmd+=(-v "$(host_path "$compile_cache_dir"):/opt/ml/compile-cache")
  script_args+=(--compile-cache-dir /opt/ml/compile-cache)
fi

if ((nnodes > 1)); then
  # The nodes meet at a barrier first; then rendezvous.py starts torchrun with its c10d rendezvous bounded the same.
  torchrun_cmd=(python -m training_assets.instance.rendezvous --nodes "$nodes" --node "$node"
    --endpoint "$rdzv_endpoint" --run-id "$rdzv_id" --timeout "$rendezvous_timeout" --max-restarts "$max_restarts"
    --record /opt/ml/output/rendezvous.json -- "--nproc_per_node=$gpus")
else
  torchrun_cmd=(torchrun "--nproc_per_node=$gpus" --standalone --nnodes=1 "--max-restarts=$max_restarts")
fi

# The image holds the code as the package it is in the repository (PYTHONPATH=/opt/training). One process checks
# the model folder and the dataset first: a problem is one line and exit status 2, where torchrun would stop every
# rank and print its own failure report. torchrun starts only when the check passes (same container, so a hub
# dataset is downloaded once).
module=training_assets.instance.train_sentiment
inside="python -m $module --check-only \"\$@\" && exec $(printf '%q ' "${torchrun_cmd[@]}")--module $module \"\$@\""
command=("${docker_cmd[@]}" "$image" bash -c "$inside" launch_training "${script_args[@]}" "${train_args[@]}")
if [[ "$dry_run" == true ]]; then
  printf '%q ' "${command[@]}"
  printf '\n'
else
  exec "${command[@]}"
fi
