#!/usr/bin/env bash
# Cloud TPU VMs for smjax: create, set up, ship the code, run on every worker, logs, delete.
#
#   launch/tpu.sh create --name NAME --zone ZONE --type v5e-8 [--project P] [--queued] [--spot]
#                        [--runtime VERSION] [--dry-run]
#   launch/tpu.sh ship   --name NAME --zone ZONE [--project P] [--dry-run]
#   launch/tpu.sh setup  --name NAME --zone ZONE [--project P] [--jax-version V] [--dry-run]
#   launch/tpu.sh run    --name NAME --zone ZONE [--project P] [--detach] [--dry-run] -- CMD ARGS...
#   launch/tpu.sh logs   --name NAME --zone ZONE [--project P] [--worker 0|all] [--dry-run]
#   launch/tpu.sh status --name NAME --zone ZONE [--project P] [--queued] [--dry-run]
#   launch/tpu.sh delete --name NAME --zone ZONE [--project P] [--queued] [--dry-run]
#
# --type: v4-N / v5p-N (N TensorCores), v5e-N / v6e-N (N chips; v5e is "v5litepod-N" in gcloud).
# --dry-run prints the exact commands, one per line, instead of running them. See launch/README.md.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JAX_VERSION_DEFAULT="0.10.2"
# shellcheck disable=SC2088  # the tilde is for the remote shell to expand, not this one
REMOTE_DIR="~/smjax"

# usage, show_help, quote
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DRY_RUN=0
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    quote "$@"
  else
    "$@"
  fi
}

# Same, with stdout sent to a file (printed as "CMD > FILE").
run_to_file() {
  local file="$1"
  shift
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '%s > %s\n' "$(quote "$@")" "$(quote "$file")"
  else
    "$@" >"$file"
  fi
}

[[ $# -ge 1 ]] || usage "missing subcommand"
SUB="$1"
shift
case "$SUB" in
  create | ship | setup | run | logs | status | delete) ;;
  -h | --help | help) show_help ;;
  *) usage "unknown subcommand '$SUB'" ;;
esac

NAME="" ZONE="" PROJECT="" TYPE="" RUNTIME="" QUEUED=0 SPOT=0 DETACH=0 WORKER="0"
JAX_VERSION="$JAX_VERSION_DEFAULT"
CMD=()
while [[ $# -gt 0 ]]; do
  arg="$1"
  if [[ "$arg" == --*=* ]]; then  # --flag=value -> --flag value
    set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
    arg="$1"
  fi
  case "$arg" in
    --name | --zone | --project | --type | --runtime | --worker | --jax-version)
      [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || usage "$arg needs a value"
      case "$arg" in
        --name) NAME="$2" ;;
        --zone) ZONE="$2" ;;
        --project) PROJECT="$2" ;;
        --type) TYPE="$2" ;;
        --runtime) RUNTIME="$2" ;;
        --worker) WORKER="$2" ;;
        --jax-version) JAX_VERSION="$2" ;;
      esac
      shift 2
      ;;
    --queued) QUEUED=1 && shift ;;
    --spot) SPOT=1 && shift ;;
    --detach) DETACH=1 && shift ;;
    --dry-run) DRY_RUN=1 && shift ;;
    --) shift && CMD=("$@") && break ;;
    -h | --help) show_help ;;
    *) usage "unknown argument '$arg'" ;;
  esac
done

[[ -n "$NAME" ]] || usage "--name is required"
[[ -n "$ZONE" ]] || usage "--zone is required"
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || usage "--name '$NAME' must be lowercase letters, digits and '-'"
[[ "$WORKER" =~ ^([0-9]+|all)$ ]] || usage "--worker must be a worker number or 'all'"

LOC=("--zone=$ZONE")
if [[ -n "$PROJECT" ]]; then
  LOC+=("--project=$PROJECT")
fi

# v5e-8 -> v5litepod-8; the runtime (TPU software version) that goes with each generation.
accelerator_type() {
  [[ "$1" =~ ^(v4|v5e|v5litepod|v5p|v6e)-([0-9]+)$ ]] || usage "--type '$1' must be one of v4-N, v5e-N, v5p-N, v6e-N"
  case "${BASH_REMATCH[1]}" in
    v5e | v5litepod) echo "v5litepod-${BASH_REMATCH[2]}" ;;
    *) echo "$1" ;;
  esac
}
default_runtime() {
  case "$1" in
    v4-*) echo "tpu-ubuntu2204-base" ;;
    v5litepod-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
  esac
}

ssh_all() {  # ssh_all WORKER REMOTE_COMMAND
  run gcloud compute tpus tpu-vm ssh "$NAME" "${LOC[@]}" "--worker=$1" --command "$2"
}

remote_command() {  # the user's words, quoted for the remote shell
  quote "$@"
}

case "$SUB" in
  create)
    [[ -n "$TYPE" ]] || usage "create needs --type (e.g. v5e-8, v4-8, v5p-8, v6e-8)"
    ACCEL="$(accelerator_type "$TYPE")"
    RUNTIME="${RUNTIME:-$(default_runtime "$ACCEL")}"
    EXTRA=()
    if [[ "$SPOT" == 1 ]]; then
      EXTRA+=("--spot")
    fi
    if [[ "$QUEUED" == 1 ]]; then
      run gcloud compute tpus queued-resources create "$NAME" "--node-id=$NAME" "${LOC[@]}" \
        "--accelerator-type=$ACCEL" "--runtime-version=$RUNTIME" ${EXTRA[@]+"${EXTRA[@]}"}
    else
      run gcloud compute tpus tpu-vm create "$NAME" "${LOC[@]}" "--accelerator-type=$ACCEL" \
        "--version=$RUNTIME" ${EXTRA[@]+"${EXTRA[@]}"}
    fi
    ;;
  ship)
    # Tracked files and untracked ones git does not ignore (no .venv, runs/, caches).
    TARBALL="${TMPDIR:-/tmp}/smjax-$NAME.tgz"
    LIST="${TMPDIR:-/tmp}/smjax-$NAME.files"
    run_to_file "$LIST" git -C "$REPO" ls-files -z --cached --others --exclude-standard
    run tar -czf "$TARBALL" -C "$REPO" --null -T "$LIST"
    run gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME:smjax-code.tgz" "${LOC[@]}" --worker=all
    # The package folders are replaced (files deleted here go there too); .venv and logs stay.
    ssh_all all "rm -rf $REMOTE_DIR/smjax $REMOTE_DIR/kernels && mkdir -p $REMOTE_DIR && \
tar -xzf ~/smjax-code.tgz -C $REMOTE_DIR"
    ;;
  setup)
    # TPU images ship Python 3.10; smjax needs >= 3.11, so uv provides one in the venv.
    # shellcheck disable=SC2088  # for the remote shell to expand
    UV="~/.local/bin/uv"
    # tcmalloc for the host side (python -m smjax.main restarts under it; smjax/cpu_malloc.py).
    ssh_all all "set -e; cd $REMOTE_DIR && \
(sudo apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 || echo 'no tcmalloc: glibc malloc') && \
python3 -m pip install --user -q uv && \
$UV venv --python 3.11 .venv && \
$UV pip install --python .venv/bin/python -e '.[gcs]' 'jax[tpu]==$JAX_VERSION' && \
.venv/bin/python -c 'import jax; print(jax.process_index(), jax.local_device_count(), jax.device_count())'"
    ;;
  run)
    [[ ${#CMD[@]} -gt 0 ]] || usage "run needs a command after --"
    # SMJAX_DISTRIBUTED=auto: smjax.distributed.maybe_initialize joins the workers into one job.
    PREFIX="cd $REMOTE_DIR && export SMJAX_DISTRIBUTED=auto && source .venv/bin/activate"
    if [[ "$DETACH" == 1 ]]; then
      ssh_all all "$PREFIX && mkdir -p logs && \
(setsid nohup $(remote_command "${CMD[@]}") > logs/run.log 2>&1 < /dev/null &)"
    else
      ssh_all all "$PREFIX && $(remote_command "${CMD[@]}")"
    fi
    ;;
  logs)
    ssh_all "$WORKER" "tail -n 200 -F $REMOTE_DIR/logs/run.log"
    ;;
  status)
    if [[ "$QUEUED" == 1 ]]; then
      run gcloud compute tpus queued-resources describe "$NAME" "${LOC[@]}"
    else
      run gcloud compute tpus tpu-vm describe "$NAME" "${LOC[@]}"
    fi
    ;;
  delete)
    if [[ "$QUEUED" == 1 ]]; then  # --force also deletes the TPU VM the request created
      run gcloud compute tpus queued-resources delete "$NAME" "${LOC[@]}" --force --quiet
    else
      run gcloud compute tpus tpu-vm delete "$NAME" "${LOC[@]}" --quiet
    fi
    ;;
esac
