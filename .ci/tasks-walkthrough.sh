#!/usr/bin/env bash
# The durable-tasks walk-through of docs/tasks-walkthrough.md (MCP
# 2026-07-28), as a check: two `resumable-server` instances, A and B, on
# one SQLite file. A task created on A asks for input; B shows the request,
# takes the answer, and reads the result. Then A is killed (SIGKILL)
# mid-count: B takes the task over once A's lease lapses and finishes it
# from A's last checkpoint, and `tasks/get` never reads it `failed`. Then B
# stops and A comes back as a front end that hands its tasks to workers
# (`--hand-off`); a worker process (`--worker`, no HTTP) runs one, is
# killed mid-count, and a second worker finishes it. Last, a task started
# with `--no-takeover` dies with its instance, as every task did before
# takeover. Fails unless each step says so.
#
#   bash .ci/tasks-walkthrough.sh path/to/resumable-server [PORT_A] [PORT_B]
set -euo pipefail
SERVER="$1"
A="${2:-18766}"
B="${3:-18767}"
work="$(mktemp -d)"
pids=()
cleanup() { # Ctrl-C the servers still running, as their users would
    for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

start() { # start PORT [FLAGS...]: a server on the shared file, its pid in $started
    local port="$1"
    shift
    "$SERVER" --store "sqlite://$work/tasks.db" --bind "127.0.0.1:$port" --task-lease-ms 3000 \
        "$@" 2>>"$work/server-$port.log" &
    started=$!
    pids+=("$started")
    for _ in $(seq 1 60); do
        curl -s -o /dev/null "http://127.0.0.1:$port/mcp" && return 0
        kill -0 "$started" 2>/dev/null || { cat "$work/server-$port.log" >&2; exit 1; }
        sleep 0.5
    done
    echo "the server on $port did not start" >&2
    exit 1
}
worker() { # a worker process on the shared file (no HTTP), its pid in $started
    "$SERVER" --worker --store "sqlite://$work/tasks.db" --task-lease-ms 3000 \
        2>>"$work/worker.log" &
    started=$!
    pids+=("$started")
}

# mcp PORT METHOD NAME PARAMS: one 2026-07-28 request declaring the tasks
# extension; prints the JSON-RPC answer (the data of the SSE response).
META='"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}'
mcp() {
    echo "\$ mcp $1 $2 $3 '$4'" >&2
    local answer
    answer="$(curl -sSN "http://127.0.0.1:$1/mcp" -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
        -H "Mcp-Method: $2" -H "Mcp-Name: $3" \
        -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":{$4,$META}}" |
        sed -n 's/^data: {/{/p')"
    # Shown on stderr through the inherited descriptor: reopening
    # /dev/stderr would truncate a log file that stderr is redirected to.
    printf '%s\n' "$answer" >&2
    printf '%s\n' "$answer"
}
expect() { # expect TEXT ANSWER
    grep -qF -- "$1" <<<"$2" || { echo "expected $1 in: $2" >&2; exit 1; }
}
task_id() { sed -n 's/.*"taskId":"\([^"]*\)".*/\1/p' <<<"$1"; }
until_status() { # until_status PORT TASK STATUS: polls tasks/get, 60 s at most
    for _ in $(seq 1 60); do
        answer="$(mcp "$1" tasks/get "$2" "\"taskId\":\"$2\"" 2>/dev/null)"
        if grep -qF "\"status\":\"$3\"" <<<"$answer"; then
            echo "\$ mcp $1 tasks/get $2 '\"taskId\":\"$2\"'" >&2
            echo "$answer" >&2
            return 0
        fi
        sleep 1
    done
    echo "task $2 never read $3; last: $answer" >&2
    exit 1
}
never_failed() { # never_failed PORT TASK: polls tasks/get until completed, 60 s
    # at most, and fails if any read says `failed`
    for _ in $(seq 1 120); do
        answer="$(mcp "$1" tasks/get "$2" "\"taskId\":\"$2\"" 2>/dev/null)"
        if grep -qF '"status":"failed"' <<<"$answer"; then
            echo "task $2 read failed: $answer" >&2
            exit 1
        fi
        if grep -qF '"status":"completed"' <<<"$answer"; then
            echo "\$ mcp $1 tasks/get $2 '\"taskId\":\"$2\"'" >&2
            echo "$answer" >&2
            return 0
        fi
        sleep 0.5
    done
    echo "task $2 never completed; last: $answer" >&2
    exit 1
}
progress() { # progress PORT TASK STEP: waits until the task's status message says STEP
    for _ in $(seq 1 60); do
        answer="$(mcp "$1" tasks/get "$2" "\"taskId\":\"$2\"" 2>/dev/null)"
        if grep -qF "\"statusMessage\":\"step $3 of" <<<"$answer"; then
            echo "\$ mcp $1 tasks/get $2 '\"taskId\":\"$2\"'" >&2
            echo "$answer" >&2
            return 0
        fi
        sleep 0.5
    done
    echo "task $2 made no progress; last: $answer" >&2
    exit 1
}

start "$A"; a=$started
start "$B"; b=$started
echo "-- A ($A) and B ($B) share $work/tasks.db" >&2

echo "-- create on A, poll and answer on B" >&2
created="$(mcp "$A" tools/call confirm_count '"name":"confirm_count","arguments":{"count":3,"interval_ms":500}')"
expect '"resultType":"task"' "$created"
T1="$(task_id "$created")"
waiting="$(mcp "$B" tasks/get "$T1" "\"taskId\":\"$T1\"")"
expect '"status":"input_required"' "$waiting"
expect '"message":"Count to 3?"' "$waiting"
ack="$(mcp "$B" tasks/update "$T1" "\"taskId\":\"$T1\",\"inputResponses\":{\"confirm\":{\"action\":\"accept\",\"content\":{\"count\":4}}}")"
expect '"result":{' "$ack"
until_status "$B" "$T1" completed
done1="$answer"
expect '"text":"counted to 4"' "$done1"

echo "-- A killed mid-count: B takes the task over from A's checkpoint" >&2
long="$(mcp "$A" tools/call slow_count '"name":"slow_count","arguments":{"count":12,"interval_ms":500}')"
T2="$(task_id "$long")"
progress "$B" "$T2" 4
{ kill -9 "$a"; wait "$a"; } 2>/dev/null || true
echo "\$ kill -9 <A>" >&2
never_failed "$B" "$T2"
expect '"text":"counted to 12 (resumed from step ' "$answer"
expect 'attempt 2)' "$answer"

echo "-- B stopped; A back as a front end that hands tasks to workers" >&2
{ kill -INT "$b"; wait "$b"; } 2>/dev/null || true
start "$A" --hand-off
worker; w=$started
queued="$(mcp "$A" tools/call slow_count '"name":"slow_count","arguments":{"count":12,"interval_ms":500}')"
T3="$(task_id "$queued")"
progress "$A" "$T3" 4
{ kill -9 "$w"; wait "$w"; } 2>/dev/null || true
echo "\$ kill -9 <worker 1>; start worker 2" >&2
worker
never_failed "$A" "$T3"
expect '"text":"counted to 12 (resumed from step ' "$answer"

echo "-- a task that dies with its instance (--no-takeover)" >&2
C="$((B + 1))"
start "$C" --no-takeover; c=$started
mortal="$(mcp "$C" tools/call slow_count '"name":"slow_count","arguments":{"count":100,"interval_ms":1000}')"
T4="$(task_id "$mortal")"
progress "$A" "$T4" 1
{ kill -9 "$c"; wait "$c"; } 2>/dev/null || true
echo "\$ kill -9 <C>" >&2
until_status "$A" "$T4" failed
expect '"error":{"code":-32603,"message":"server instance lost"}' "$answer"
done1="$(mcp "$A" tasks/get "$T1" "\"taskId\":\"$T1\"")"
expect '"status":"completed"' "$done1"
echo "-- durable tasks across instances, workers and SIGKILLs: ok" >&2
