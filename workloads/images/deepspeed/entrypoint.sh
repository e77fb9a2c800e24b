#!/bin/bash
# DeepSpeed image entrypoint and shell library.
#
# The Bitnami DeepSpeed Helm chart (2.x) runs `source` on
# /opt/bitnami/scripts/deepspeed/entrypoint.sh in every container it starts
# when the file exists, and its `wait-for-workers` init container then calls
# `retry_while "check_worker <host>"` to wait until every worker answers over
# SSH. This file is our own implementation of that contract:
#
#   sourced                     defines the helper functions below; prints
#                               nothing, changes no options, never execs
#                               (even if the sourcing shell has positional
#                               arguments of its own);
#   executed with arguments     exec "$@" (the image ENTRYPOINT);
#   executed without arguments  nothing to do, exits 0.

# retry_while COMMAND [RETRIES] [SLEEP_SECONDS]
#
# Evaluates COMMAND (a shell command string, run with `eval` in the current
# shell, so shell functions work) until it succeeds, at most RETRIES times
# (default 30), sleeping SLEEP_SECONDS (default 10) between attempts but not
# after the last one. Returns 0 on the first success, 1 when every attempt
# failed and 2 on bad arguments. Prints nothing itself.
retry_while() {
    local cmd="${1:-}"
    local retries="${2:-30}"
    local sleep_time="${3:-10}"
    local attempt

    if [[ -z "$cmd" ]]; then
        echo "retry_while: missing command" >&2
        return 2
    fi
    if [[ ! "$retries" =~ ^[0-9]+$ ]] || ((retries < 1)); then
        echo "retry_while: retries must be a positive integer, got '$retries'" >&2
        return 2
    fi
    if [[ ! "$sleep_time" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
        echo "retry_while: sleep must be a non-negative number of seconds, got '$sleep_time'" >&2
        return 2
    fi

    for ((attempt = 1; attempt <= retries; attempt++)); do
        if eval "$cmd"; then
            return 0
        fi
        if ((attempt < retries)); then
            sleep "$sleep_time"
        fi
    done
    return 1
}

# Executed rather than sourced: act as the image entrypoint.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    if (($# > 0)); then
        exec "$@"
    fi
    exit 0
fi
