#!/usr/bin/env bash
# The curl walk-through of docs/resume-walkthrough.md, as a check: against
# a running `resumable-server` (`cargo run -p resumable-server`, session
# mode), start a slow tool call, drop the connection half way, and resume
# once with Last-Event-ID while the call is still running. Fails unless that one
# resume streams exactly the missed steps, the ones still to come, and the
# result.
#
#   bash .ci/resume-walkthrough.sh [http://127.0.0.1:8000/mcp]
set -euo pipefail
URL="${1:-http://127.0.0.1:8000/mcp}"
COUNT=6
JSON=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "-- initialize"
curl -sS -D "$work/headers" "${JSON[@]}" "$URL" \
    -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}' \
    > "$work/init"
SESSION="$(grep -i '^mcp-session-id:' "$work/headers" | cut -d' ' -f2 | tr -d '\r')"
[ -n "$SESSION" ] || { echo "no session id" >&2; cat "$work/headers" "$work/init" >&2; exit 1; }
echo "session $SESSION"
S=(-H "Mcp-Session-Id: $SESSION" -H 'MCP-Protocol-Version: 2025-11-25')
curl -sS -o /dev/null "${JSON[@]}" "${S[@]}" "$URL" -d '{"jsonrpc":"2.0","method":"notifications/initialized"}'

echo "-- tools/call slow_count, dropped after 1 s"
curl -sSN --max-time 1 "${JSON[@]}" "${S[@]}" "$URL" \
    -d "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"slow_count\",\"arguments\":{\"count\":$COUNT,\"interval_ms\":300},\"_meta\":{\"progressToken\":\"walkthrough\"}}}" \
    > "$work/live" || true   # curl exits 28 when --max-time drops the connection
cat "$work/live"
LAST="$(grep '^id: ' "$work/live" | tail -1 | cut -d' ' -f2)"
[ -n "$LAST" ] || { echo "no event id before the drop" >&2; exit 1; }
seen="$(grep -c 'notifications/progress' "$work/live" || true)"
echo "-- dropped after $seen progress notifications; resuming after $LAST"

# One resume, issued mid-call: the response follows the call live and ends
# after the result.
curl -sSN --max-time 30 "${S[@]}" -H 'Accept: text/event-stream' -H "Last-Event-ID: $LAST" "$URL" \
    > "$work/resumed"
cat "$work/resumed"

grep -q "counted to $COUNT" "$work/resumed" || { echo "the resume ended without the result" >&2; exit 1; }
steps="$(cat "$work/live" "$work/resumed" | grep -o '"step [0-9]* of' | cut -d' ' -f2 | tr '\n' ' ')"
[ "$steps" = "$(seq -s ' ' 1 $COUNT) " ] || { echo "steps were not each sent once, in order: $steps" >&2; exit 1; }
echo "-- one resume: every step exactly once, then the result: ok"
