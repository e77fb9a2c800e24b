#!/bin/bash
# Vertex AI CustomJob entry point for the DeepSpeed image.
#
# Usage (containerSpec.command / args of every worker pool):
#   vertex_start.sh [--] TRAINING_SCRIPT [ARGS...]   # launched with the deepspeed CLI
#   vertex_start.sh --command CMD [ARGS...]          # run CMD as is (DEEPSPEED_HOSTFILE is
#                                                    # exported on a multi-node primary)
#
# No CLUSTER_SPEC (local run) or a single host: run `deepspeed TRAINING_SCRIPT ARGS...` (with the
# AIP_* paths mapped as below).
# Several hosts (worker pool 0 = primary, worker pool 1 = workers):
#   * every host maps AIP_MODEL_DIR/AIP_CHECKPOINT_DIR/AIP_TENSORBOARD_LOG_DIR from gs:// to
#     the /gcs/ FUSE mount, generates an SSH host key and starts sshd on port 2222;
#   * the primary generates an ed25519 client key (no private key is baked into the image),
#     publishes only its PUBLIC key in the exchange directory on the bucket mount
#     (VERTEX_SSH_EXCHANGE_DIR, default <parent of AIP_MODEL_DIR>/.ssh-exchange/<job id>),
#     waits (bounded) until every host answers `ssh -p 2222 HOST true`, deletes the published
#     key, writes the hostfile (slots = GPUs per host from `nvidia-smi -L`) and runs
#     `deepspeed --hostfile=HOSTFILE TRAINING_SCRIPT ARGS...`; its exit status is the job's;
#   * workers install the published key into ~/.ssh/authorized_keys and serve SSH until the
#     job ends.
#
# Stopping (preemption, a cancelled job): Vertex AI sends SIGTERM to each replica's main process only,
# this script, and the container's other processes die with it. So on SIGTERM (or SIGINT) every host
# passes it on to its own training ranks with the stack's stop_ranks.py (VERTEX_STOP_RANKS: the file
# the stack ships beside the recipe on the bucket, copied to local disk at start), waits until they have
# saved their checkpoint and exited (finetune.py and smoke_train.py save on SIGTERM; the ranks agree on it
# at the next step, so every host saves whichever got the signal), and only then stops its own child:
# DeepSpeed's runner on the primary (which by then exits with the ranks' status, 143), sshd on a worker.
# Without VERTEX_STOP_RANKS the child gets the SIGTERM at once (DeepSpeed's runner kills the per-node
# launchers, which give their ranks 30 s). The script then exits 143 unless the child finished with 0.
# Vertex's SIGKILL bounds the wait. A restarted job (scheduling.restartJobOnWorkerRestart) starts the
# same command again and the training script resumes from its newest checkpoint.
#
# Tunables (environment): VERTEX_SSH_PORT (2222), VERTEX_SSH_WAIT_RETRIES (180) and
# VERTEX_SSH_WAIT_SLEEP (5 s) bound every wait, VERTEX_RUNTIME_DIR (/tmp/vertex-deepspeed),
# VERTEX_SSH_EXCHANGE_DIR, VERTEX_PYTHON (python3), VERTEX_CLUSTER_PY, VERTEX_STOP_RANKS,
# VERTEX_STOP_WAIT (seconds the stopped child gets to exit on its own once the ranks are gone: 10).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERTEX_PYTHON="${VERTEX_PYTHON:-python3}"
VERTEX_CLUSTER_PY="${VERTEX_CLUSTER_PY:-$SCRIPT_DIR/vertex_cluster.py}"
SSH_PORT="${VERTEX_SSH_PORT:-2222}"
WAIT_RETRIES="${VERTEX_SSH_WAIT_RETRIES:-180}"
WAIT_SLEEP="${VERTEX_SSH_WAIT_SLEEP:-5}"
RUNTIME_DIR="${VERTEX_RUNTIME_DIR:-${TMPDIR:-/tmp}/vertex-deepspeed}"
PUBLISHED_KEY_NAME="primary_ed25519.pub"
STOP_WAIT="${VERTEX_STOP_WAIT:-10}"
RANKS_WAIT=86400 # stop_ranks.py's own bound: Vertex's SIGKILL ends the wait first
# Variables handed to processes started over SSH (~/.ssh/environment) when set. FINETUNE_STACK_KEYS (the stack's
# key of each recipe flag, JSON, set on every replica by the CustomJob) goes this way only: sshd reads the file's
# values as they are, where DeepSpeed's runner would pass ~/.deepspeed_env's through a shell that drops its quotes.
# So do the progress callback's inputs (the GPU's peak, the model's FLOPs, Vertex's $/h, the run's estimate as JSON):
# every rank logs tokens/s and MFU, rank 0 writes the cost and the estimate vs measured.
SSH_ENV_VARS=(
    PATH LD_LIBRARY_PATH CUDA_HOME TRITON_CACHE_DIR TORCH_EXTENSIONS_DIR HF_HOME
    PDSH_RCMD_TYPE PYTHONUNBUFFERED PYTHONDONTWRITEBYTECODE
    AIP_MODEL_DIR AIP_CHECKPOINT_DIR AIP_TENSORBOARD_LOG_DIR CLOUD_ML_JOB_ID CLOUD_ML_PROJECT_ID
    FINETUNE_STACK_KEYS FINETUNE_PEAK_TFLOPS FINETUNE_MODEL_FLOPS FINETUNE_PRICE_PER_HOUR FINETUNE_ESTIMATE
)

log() { printf '[vertex_start] %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# retry_while comes from the image entrypoint library (next to this script in the repository).
if [[ -f /opt/bitnami/scripts/deepspeed/entrypoint.sh ]]; then
    # shellcheck source-path=SCRIPTDIR source=entrypoint.sh disable=SC1091  # library with retry_while
    source /opt/bitnami/scripts/deepspeed/entrypoint.sh
else
    # shellcheck source-path=SCRIPTDIR source=entrypoint.sh disable=SC1091  # library with retry_while
    source "$SCRIPT_DIR/entrypoint.sh"
fi

mode="deepspeed"
if [[ "${1:-}" == "--command" ]]; then
    mode="command"
    shift
elif [[ "${1:-}" == "--" ]]; then
    shift
fi
(($# > 0)) || die "usage: vertex_start.sh [--] TRAINING_SCRIPT [ARGS...] | --command CMD [ARGS...]"

# launch HOSTFILE ARGS...  (HOSTFILE empty: single node): the launch command, run as this script's child
launch() {
    local hostfile="$1"
    shift
    if [[ "$mode" == "command" ]]; then
        if [[ -n "$hostfile" ]]; then
            export DEEPSPEED_HOSTFILE="$hostfile"
        fi
        run_child "$@"
    elif [[ -n "$hostfile" ]]; then
        run_child deepspeed --hostfile="$hostfile" "$@"
    else
        run_child deepspeed "$@"
    fi
}

# run_child CMD [ARGS...]: CMD in the background, waited for, its status returned. This script stays the
# container's main process, the one Vertex signals; on_stop passes the signal on.
CHILD_PID=""
CHILD_IS_SSHD=""
run_child() {
    "$@" &
    CHILD_PID=$!
    local status=0
    wait_child || status=$?
    CHILD_PID=""
    return "$status"
}

# wait_child: CHILD_PID's own exit status. A trapped signal ends `wait` early: wait again, until the child is gone.
wait_child() {
    local status=0
    wait "$CHILD_PID" || status=$?
    while kill -0 "$CHILD_PID" 2>/dev/null; do
        status=0
        wait "$CHILD_PID" || status=$?
    done
    return "$status"
}

# The stack's stop_ranks.py, copied to local disk at start: the bucket mount may be going away on SIGTERM.
STOP_RANKS_PY=""
prepare_stop_ranks() {
    local source="${VERTEX_STOP_RANKS:-}"
    [[ -n "$source" ]] || return 0
    if [[ ! -r "$source" ]]; then
        log "WARNING: VERTEX_STOP_RANKS=$source cannot be read: on SIGTERM the launcher gets it, not the ranks"
        return 0
    fi
    mkdir -p "$RUNTIME_DIR"
    cp "$source" "$RUNTIME_DIR/stop_ranks.py"
    STOP_RANKS_PY="$RUNTIME_DIR/stop_ranks.py"
}

STOPPED_BY=""
# on_stop SIGNAL: the ranks on this host first (they save, then exit), then the child.
on_stop() {
    if [[ -n "$STOPPED_BY" ]]; then
        return 0 # already stopping
    fi
    STOPPED_BY="SIG$1"
    if [[ -n "$STOP_RANKS_PY" ]]; then
        log "SIG$1: passing it on to the training ranks on this host; waiting for their checkpoint"
        "$VERTEX_PYTHON" "$STOP_RANKS_PY" --timeout "$RANKS_WAIT" >&2 || true
        # DeepSpeed's runner ends by itself once the ranks have (with their status); a worker's sshd never does.
        local waited=0
        while [[ -z "$CHILD_IS_SSHD" && -n "$CHILD_PID" ]] && kill -0 "$CHILD_PID" 2>/dev/null &&
            ((waited < STOP_WAIT * 20)); do
            sleep 0.05
            waited=$((waited + 1))
        done
    fi
    if [[ -z "$CHILD_PID" ]]; then
        log "SIG$1 before the launch: stopping"
        exit 143
    fi
    if kill -0 "$CHILD_PID" 2>/dev/null; then
        log "SIG$1: stopping the launch command (pid $CHILD_PID)"
        kill -TERM "$CHILD_PID" 2>/dev/null || true
    fi
}

count_local_gpus() {
    local listing
    listing="$(nvidia-smi -L 2>/dev/null || true)"
    grep -c '^GPU ' <<<"$listing" || true
}

count_remote_gpus() {
    local listing
    listing="$(ssh -n "$1" nvidia-smi -L 2>/dev/null || true)"
    grep -c '^GPU ' <<<"$listing" || true
}

ssh_ok() {
    ssh -n -o ConnectTimeout=5 "$1" true >/dev/null 2>&1
}

# ~/.ssh (client config, environment for SSH sessions), host key, sshd.
setup_ssh() {
    umask 077
    mkdir -p "$HOME/.ssh" "$RUNTIME_DIR"
    chmod 700 "$HOME/.ssh"
    touch "$HOME/.ssh/authorized_keys"
    chmod 600 "$HOME/.ssh/authorized_keys"
    {
        printf '%s\n' "Host *" \
            "    Port $SSH_PORT" \
            "    IdentityFile $HOME/.ssh/id_ed25519" \
            "    BatchMode yes" \
            "    StrictHostKeyChecking no" \
            "    UserKnownHostsFile /dev/null" \
            "    LogLevel ERROR"
    } >"$HOME/.ssh/config"
    local name
    : >"$HOME/.ssh/environment"
    for name in "${SSH_ENV_VARS[@]}"; do
        if [[ -n "${!name:-}" ]]; then
            printf '%s=%s\n' "$name" "${!name}" >>"$HOME/.ssh/environment"
        fi
    done
    rm -f "$RUNTIME_DIR/ssh_host_ed25519_key" "$RUNTIME_DIR/ssh_host_ed25519_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "vertex-host-key" -f "$RUNTIME_DIR/ssh_host_ed25519_key"
}

SSHD_PID=""
start_sshd() {
    if [[ "$(id -u)" == "0" ]]; then
        mkdir -p /run/sshd # privilege separation directory, needed only as root
    fi
    "$(command -v sshd)" -D -e \
        -p "$SSH_PORT" \
        -h "$RUNTIME_DIR/ssh_host_ed25519_key" \
        -o PidFile="$RUNTIME_DIR/sshd.pid" \
        -o PasswordAuthentication=no \
        -o KbdInteractiveAuthentication=no \
        -o PubkeyAuthentication=yes \
        -o UsePAM=no \
        -o PermitUserEnvironment=yes \
        -o AuthorizedKeysFile=.ssh/authorized_keys &
    SSHD_PID=$!
    log "sshd started on port $SSH_PORT (pid $SSHD_PID)"
}

stop_sshd() {
    if [[ -n "$SSHD_PID" ]]; then
        kill "$SSHD_PID" 2>/dev/null || true
    fi
}

PUBLISHED_KEY=""
cleanup() {
    if [[ -n "$PUBLISHED_KEY" ]]; then
        rm -f "$PUBLISHED_KEY"
    fi
    stop_sshd
}

run_primary() {
    local -a hosts
    read -r -a hosts <<<"$VERTEX_HOSTS"

    rm -f "$HOME/.ssh/id_ed25519" "$HOME/.ssh/id_ed25519.pub"
    ssh-keygen -q -t ed25519 -N '' -C "deepspeed-vertex-$VERTEX_JOB_ID" -f "$HOME/.ssh/id_ed25519"
    # The primary is a DeepSpeed host too: the launcher reaches it over SSH like the others.
    cat "$HOME/.ssh/id_ed25519.pub" >>"$HOME/.ssh/authorized_keys"
    start_sshd

    mkdir -p "$VERTEX_SSH_EXCHANGE_DIR" || die "cannot create the key exchange directory $VERTEX_SSH_EXCHANGE_DIR"
    PUBLISHED_KEY="$VERTEX_SSH_EXCHANGE_DIR/$PUBLISHED_KEY_NAME"
    cp "$HOME/.ssh/id_ed25519.pub" "$PUBLISHED_KEY.tmp"
    mv -f "$PUBLISHED_KEY.tmp" "$PUBLISHED_KEY"
    log "published the primary's public key at $PUBLISHED_KEY"

    local host
    for host in "${hosts[@]}"; do
        log "waiting for ssh -p $SSH_PORT $host"
        retry_while "ssh_ok $(printf '%q' "$host")" "$WAIT_RETRIES" "$WAIT_SLEEP" ||
            die "host $host did not answer over SSH after $WAIT_RETRIES attempts"
    done
    rm -f "$PUBLISHED_KEY"
    PUBLISHED_KEY=""
    rmdir "$VERTEX_SSH_EXCHANGE_DIR" 2>/dev/null || true
    log "all ${#hosts[@]} hosts answer over SSH; published key deleted"

    local local_slots count
    local -a slot_args=()
    local_slots="$(count_local_gpus)"
    for host in "${hosts[@]}"; do
        if [[ "$host" == "$VERTEX_THIS_HOST" ]]; then
            count="$local_slots"
        else
            count="$(count_remote_gpus "$host")"
        fi
        ((count > 0)) || die "no GPU visible on $host (nvidia-smi -L listed none)"
        slot_args+=(--host-slots "$host=$count")
    done
    local hostfile="$RUNTIME_DIR/hostfile"
    "$VERTEX_PYTHON" "$VERTEX_CLUSTER_PY" hostfile "${slot_args[@]}" --output "$hostfile" ||
        die "cannot write the DeepSpeed hostfile"
    log "hostfile $hostfile:"
    sed 's/^/    /' "$hostfile" >&2

    # DeepSpeed forwards the variables listed in ~/.deepspeed_env to every rank.
    : >"$HOME/.deepspeed_env"
    local name
    for name in AIP_MODEL_DIR AIP_CHECKPOINT_DIR AIP_TENSORBOARD_LOG_DIR CLOUD_ML_JOB_ID; do
        if [[ -n "${!name:-}" ]]; then
            printf '%s=%s\n' "$name" "${!name}" >>"$HOME/.deepspeed_env"
        fi
    done

    local status=0
    launch "$hostfile" "$@" || status=$?
    log "launch command exited with status $status"
    return "$status"
}

# install_published_key FILE: the key in FILE into authorized_keys, unless it is there already.
install_published_key() {
    local key
    key="$(cat "$1" 2>/dev/null || true)"
    if [[ -n "$key" ]] && ! grep -qxF -- "$key" "$HOME/.ssh/authorized_keys"; then
        printf '%s\n' "$key" >>"$HOME/.ssh/authorized_keys"
        log "installed the primary's public key from $1"
    fi
}

run_worker() {
    local pubfile="$VERTEX_SSH_EXCHANGE_DIR/$PUBLISHED_KEY_NAME"
    log "waiting for the primary's public key at $pubfile"
    retry_while "[[ -s $(printf '%q' "$pubfile") ]]" "$WAIT_RETRIES" "$WAIT_SLEEP" ||
        die "the primary did not publish its key at $pubfile"
    install_published_key "$pubfile"
    start_sshd
    log "serving SSH for the primary until the job ends"
    # sshd as the child that on_stop stops, once this host's ranks have saved.
    CHILD_PID="$SSHD_PID"
    CHILD_IS_SSHD=1
    # Until the primary deletes its published key (every host answered), a newer one is installed too: a job
    # that Vertex AI restarts whole keeps its job id, hence its exchange folder, and a key the last attempt's
    # primary left there (stopped before it deleted it) may be read here before this attempt's primary replaces it.
    while [[ -e "$pubfile" ]] && kill -0 "$CHILD_PID" 2>/dev/null; do
        install_published_key "$pubfile"
        sleep "$WAIT_SLEEP" &
        wait $! || true
    done
    local status=0
    wait_child || status=$?
    CHILD_PID=""
    SSHD_PID=""
    return "$status"
}

trap 'on_stop TERM' TERM
trap 'on_stop INT' INT
prepare_stop_ranks

if [[ -z "${CLUSTER_SPEC:-}" ]]; then
    log "CLUSTER_SPEC is not set: single-node run"
    paths_env="$("$VERTEX_PYTHON" "$VERTEX_CLUSTER_PY" paths)" || die "cannot map the AIP_* paths (see the error above)"
    eval "$paths_env"
    status=0
    launch "" "$@" || status=$?
    exit "$status"
fi

cluster_env="$("$VERTEX_PYTHON" "$VERTEX_CLUSTER_PY" env)" || die "cannot use CLUSTER_SPEC (see the error above)"
eval "$cluster_env"

if [[ "$VERTEX_ROLE" == "other" ]]; then
    log "this replica (pool 2/3) is not part of the DeepSpeed cluster; nothing to do"
    exit 0
fi
if ((VERTEX_NUM_HOSTS == 1)); then
    log "single host $VERTEX_PRIMARY_HOST"
    status=0
    launch "" "$@" || status=$?
    exit "$status"
fi

log "multi-node job $VERTEX_JOB_ID: $VERTEX_NUM_HOSTS hosts, this is the $VERTEX_ROLE ($VERTEX_THIS_HOST)"
trap cleanup EXIT
setup_ssh
if [[ "$VERTEX_ROLE" == "primary" ]]; then
    run_primary "$@"
else
    run_worker
fi
