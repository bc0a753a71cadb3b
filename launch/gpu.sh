#!/usr/bin/env bash
# smjax on GPUs: one process per node drives all of that node's GPUs; nodes join via jax.distributed.
#
#   launch/gpu.sh run [--nodes N] [--gpus-per-node G] [--coordinator HOST:PORT] [--node-rank R]
#                     [--dry-run] -- CMD ARGS...
#       Runs CMD on this node. With --nodes > 1, run it on every node with the same --nodes,
#       --coordinator (node 0's address and a free port) and each node's own --node-rank.
#   launch/gpu.sh ssh --hosts H0,H1,... [--gpus-per-node G] [--port P] [--workdir DIR]
#                     [--dry-run] -- CMD ARGS...
#       Starts `gpu.sh run` on every host over ssh (H0 is the coordinator) and waits for all.
#
# CMD must call smjax.distributed.maybe_initialize() before any jax computation; it reads the
# SMJAX_COORDINATOR_ADDRESS / SMJAX_NUM_PROCESSES / SMJAX_PROCESS_ID variables set here.
# --dry-run prints the exact commands instead of running them. See launch/README.md.
set -euo pipefail

# usage, show_help, quote
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ $# -ge 1 ]] || usage "missing subcommand"
SUB="$1"
shift
case "$SUB" in
  run | ssh) ;;
  -h | --help | help) show_help ;;
  *) usage "unknown subcommand '$SUB'" ;;
esac

NODES=1 GPUS="" COORD="" RANK="" HOSTS="" PORT=12355 WORKDIR="" DRY_RUN=0
CMD=()
while [[ $# -gt 0 ]]; do
  arg="$1"
  if [[ "$arg" == --*=* ]]; then  # --flag=value -> --flag value
    set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
    arg="$1"
  fi
  case "$arg" in
    --nodes | --gpus-per-node | --coordinator | --node-rank | --hosts | --port | --workdir)
      [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || usage "$arg needs a value"
      case "$arg" in
        --nodes) NODES="$2" ;;
        --gpus-per-node) GPUS="$2" ;;
        --coordinator) COORD="$2" ;;
        --node-rank) RANK="$2" ;;
        --hosts) HOSTS="$2" ;;
        --port) PORT="$2" ;;
        --workdir) WORKDIR="$2" ;;
      esac
      shift 2
      ;;
    --dry-run) DRY_RUN=1 && shift ;;
    --) shift && CMD=("$@") && break ;;
    -h | --help) show_help ;;
    *) usage "unknown argument '$arg'" ;;
  esac
done

[[ ${#CMD[@]} -gt 0 ]] || usage "$SUB needs a command after --"
[[ -z "$GPUS" || "$GPUS" =~ ^[1-9][0-9]*$ ]] || usage "--gpus-per-node must be a positive integer"

if [[ "$SUB" == run ]]; then
  [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || usage "--nodes must be a positive integer"
  ENV=()
  if [[ -n "$GPUS" ]]; then
    ENV+=("CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((GPUS - 1)))")
  fi
  if [[ "$NODES" -gt 1 ]]; then
    [[ "$COORD" =~ ^[^:[:space:]]+:[0-9]+$ ]] || usage "--nodes $NODES needs --coordinator HOST:PORT (node 0)"
    [[ "$RANK" =~ ^[0-9]+$ && "$RANK" -lt "$NODES" ]] || usage "--node-rank must be in [0, $NODES)"
    ENV+=("SMJAX_COORDINATOR_ADDRESS=$COORD" "SMJAX_NUM_PROCESSES=$NODES" "SMJAX_PROCESS_ID=$RANK")
  elif [[ -n "$COORD" || -n "$RANK" && "$RANK" != 0 ]]; then
    usage "--coordinator/--node-rank need --nodes > 1"
  fi
  if [[ "$DRY_RUN" == 1 ]]; then
    quote env ${ENV[@]+"${ENV[@]}"} "${CMD[@]}"
    exit 0
  fi
  exec env ${ENV[@]+"${ENV[@]}"} "${CMD[@]}"
fi

# ssh: one `gpu.sh run` per host, node 0 (the first host) as the coordinator.
[[ -n "$HOSTS" ]] || usage "ssh needs --hosts H0,H1,..."
[[ "$PORT" =~ ^[0-9]+$ ]] || usage "--port must be a number"
IFS=, read -r -a HOST_LIST <<<"$HOSTS"
N=${#HOST_LIST[@]}
WORKDIR="${WORKDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
PIDS=()
for i in "${!HOST_LIST[@]}"; do
  REMOTE=(launch/gpu.sh run --nodes "$N" --coordinator "${HOST_LIST[0]}:$PORT" --node-rank "$i")
  if [[ -n "$GPUS" ]]; then
    REMOTE+=(--gpus-per-node "$GPUS")
  fi
  LINE="cd $(quote "$WORKDIR") && $(quote "${REMOTE[@]}" -- "${CMD[@]}")"
  if [[ "$DRY_RUN" == 1 ]]; then
    quote ssh "${HOST_LIST[$i]}" "$LINE"
  else
    # shellcheck disable=SC2029  # LINE is built (and quoted) here on purpose
    ssh "${HOST_LIST[$i]}" "$LINE" &
    PIDS+=("$!")
  fi
done
STATUS=0
for pid in ${PIDS[@]+"${PIDS[@]}"}; do
  wait "$pid" || STATUS=$?
done
exit "$STATUS"
