#!/usr/bin/env bash
# The durable-tasks walk-through of docs/tasks-walkthrough.md (MCP
# 2026-07-28), as a check: two `resumable-server` instances, A and B, on
# one SQLite file. A task created on A asks for input; B shows the request,
# takes the answer, and reads the result. Then A is killed (SIGKILL) mid-task: B reads that task `failed`
# once A's lease lapses, while a task A finished before dying stays
# `completed`; A restarted serves new tasks. Fails unless each step says so.
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

start() { # start PORT: a server on the shared file, its pid in $started
    "$SERVER" --store "sqlite://$work/tasks.db" --bind "127.0.0.1:$1" --task-lease-ms 5000 \
        2>>"$work/server-$1.log" &
    started=$!
    pids+=("$started")
    for _ in $(seq 1 60); do
        curl -s -o /dev/null "http://127.0.0.1:$1/mcp" && return 0
        kill -0 "$started" 2>/dev/null || { cat "$work/server-$1.log" >&2; exit 1; }
        sleep 0.5
    done
    echo "the server on $1 did not start" >&2
    exit 1
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

start "$A"; a=$started
start "$B"
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

echo "-- A killed mid-task" >&2
short="$(mcp "$A" tools/call slow_count '"name":"slow_count","arguments":{"count":1,"interval_ms":1}')"
T2="$(task_id "$short")"
long="$(mcp "$A" tools/call slow_count '"name":"slow_count","arguments":{"count":100,"interval_ms":1000}')"
T3="$(task_id "$long")"
until_status "$B" "$T2" completed
sleep 2
{ kill -9 "$a"; wait "$a"; } 2>/dev/null || true
echo "\$ kill -9 <A>" >&2
still="$(mcp "$B" tasks/get "$T3" "\"taskId\":\"$T3\"")"
expect '"status":"working"' "$still"
until_status "$B" "$T3" failed
expect '"error":{"code":-32603,"message":"server instance lost"}' "$answer"
kept="$(mcp "$B" tasks/get "$T2" "\"taskId\":\"$T2\"")"
expect '"status":"completed"' "$kept"
expect '"text":"counted to 1"' "$kept"

echo "-- A restarted" >&2
start "$A"
again="$(mcp "$A" tasks/get "$T3" "\"taskId\":\"$T3\"")"
expect '"status":"failed"' "$again"
fresh="$(mcp "$A" tools/call slow_count '"name":"slow_count","arguments":{"count":2,"interval_ms":100}')"
T4="$(task_id "$fresh")"
until_status "$B" "$T4" completed
expect '"text":"counted to 2"' "$answer"
echo "-- durable tasks across instances and a restart: ok" >&2
