#!/bin/sh
# deepspeed-stack: one node of a vLLM replica across nodes, a LeaderWorkerSet group (workloads/serving_group.py).
#
#   serve_group.sh VLLM-ARGS...        (the same arguments on every node of the group)
#
# The LeaderWorkerSet controller (kubernetes-sigs/lws v0.10.0) puts LWS_LEADER_ADDRESS (the leader pod's DNS name),
# LWS_GROUP_SIZE and LWS_WORKER_INDEX (0 for the leader) into every container; the stack sets GROUP_NODES (the group
# size it rendered), MASTER_PORT and, on a GPU fabric pool, NCCL_ENV_SCRIPT. vLLM's multiprocessing backend spans the
# nodes (data/serving.yaml multiNode): node rank = worker index; the leader runs the OpenAI server, the others
# `vllm serve --headless` (the engine's workers, no API). Exit 2 without starting anything when the group is not the
# one rendered (a wrong size would hang every node at the rendezvous).
set -eu

fail() {
    echo "serve_group.sh: $*" >&2
    exit 2
}

: "${LWS_LEADER_ADDRESS:?is not set: this pod is not part of a LeaderWorkerSet group}"
: "${LWS_GROUP_SIZE:?is not set: this pod is not part of a LeaderWorkerSet group}"
: "${LWS_WORKER_INDEX:?is not set: this pod is not part of a LeaderWorkerSet group}"
: "${GROUP_NODES:?is not set: the group size the stack rendered}"
: "${MASTER_PORT:?is not set: the torch.distributed port of the leader}"

for value in "$LWS_GROUP_SIZE" "$LWS_WORKER_INDEX" "$GROUP_NODES" "$MASTER_PORT"; do
    case "$value" in
        '' | *[!0-9]*) fail "expected a whole number, got '$value'" ;;
    esac
done
[ "$LWS_GROUP_SIZE" -eq "$GROUP_NODES" ] ||
    fail "the group has $LWS_GROUP_SIZE pods, the stack rendered $GROUP_NODES nodes per replica"
[ "$LWS_WORKER_INDEX" -lt "$LWS_GROUP_SIZE" ] ||
    fail "worker index $LWS_WORKER_INDEX is outside a group of $LWS_GROUP_SIZE"

set -- "$@" --nnodes "$LWS_GROUP_SIZE" --node-rank "$LWS_WORKER_INDEX" \
    --master-addr "$LWS_LEADER_ADDRESS" --master-port "$MASTER_PORT"
if [ "$LWS_WORKER_INDEX" -eq 0 ]; then
    set -- python -m vllm.entrypoints.openai.api_server "$@"
else
    set -- vllm serve "$@" --headless
fi
echo "serve_group.sh: node $LWS_WORKER_INDEX of $LWS_GROUP_SIZE, leader $LWS_LEADER_ADDRESS:$MASTER_PORT" >&2
if [ -n "${NCCL_ENV_SCRIPT:-}" ]; then
    exec /bin/bash "$NCCL_ENV_SCRIPT" "$@"
fi
exec "$@"
