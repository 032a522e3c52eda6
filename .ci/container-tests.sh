#!/usr/bin/env bash
# CI's container step: the server-backed backends' test suites (PostgreSQL,
# Redis and NATS: the crates whose test support reads an image variable
# built here) again, with their servers in containers (the test kit's container path, which the
# local servers otherwise always pre-empt), and the test kit's own check
# that a test binary's container is removed when the binary exits.
#
# It reruns the executables `cargo test --workspace --all-features` built
# (listed by the same command with --no-run, so nothing is rebuilt and the
# features are the same), with MCP_EVENT_STORE_TEST_SERVER=container and the
# images built here from the local Debian packages
# (.ci/build-test-images.sh). It installs Debian's docker.io (and jq) if
# missing, starts an engine that publishes ports on loopback only unless
# one already answers, stops the engine it started (also on failure), fails
# if a container of the tests is left, and prints how long each part took.
# Needs root, as CI runs; a developer may run it too.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

LABEL=mcp-event-store.test-run
KIT_TEST=testkit::server::tests::docker::one_container_per_test_binary_removed_when_it_exits

work=$(mktemp -d /tmp/mcp-event-store-container-tests.XXXXXX)
dockerd_pid=
timings=()

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Runs a part and records how long it took.
timed() {
    local name=$1 start
    shift
    start=$(now)
    echo "-- $name"
    "$@"
    timings+=("$(printf '%-34s %6s s' "$name" "$(since "$start")")")
}

finish() {
    local status=$? start
    # A failed step leaves no container behind for the next run to trip on.
    [ "$status" = 0 ] || remove_test_containers
    if [ -n "$dockerd_pid" ]; then
        start=$(now)
        kill "$dockerd_pid" 2>/dev/null || true
        wait "$dockerd_pid" 2>/dev/null || true
        timings+=("$(printf '%-34s %6s s' "stop dockerd (pid $dockerd_pid)" "$(since "$start")")")
    fi
    [ "$status" = 0 ] || echo "-- the container step failed (exit $status)" >&2
    echo "-- container step timings"
    printf '   %s\n' "${timings[@]}"
    rm -rf "$work"
    exit "$status"
}
trap finish EXIT

install_docker() {
    if command -v dockerd >/dev/null && command -v docker >/dev/null && command -v jq >/dev/null; then
        echo "docker.io and jq are installed"
        return
    fi
    local install=(apt-get install -y -q --no-install-recommends docker.io jq)
    export DEBIAN_FRONTEND=noninteractive
    if ! "${install[@]}" >"$work/apt.log" 2>&1; then
        apt-get update -q >>"$work/apt.log" 2>&1 && "${install[@]}" >>"$work/apt.log" 2>&1 \
            || { tail -20 "$work/apt.log" >&2; return 1; }
    fi
}

start_engine() {
    if docker info >/dev/null 2>&1; then
        echo "a Docker engine answers already: using it"
        return
    fi
    # Published ports bound to loopback only.
    dockerd --ip 127.0.0.1 -H unix:///var/run/docker.sock >"$work/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 1 300); do
        docker info >/dev/null 2>&1 && { echo "dockerd (pid $dockerd_pid) answers"; return; }
        kill -0 "$dockerd_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "dockerd did not answer within 30 s:" >&2
    tail -20 "$work/dockerd.log" >&2
    return 1
}

build_images() {
    local images
    images=$(bash .ci/build-test-images.sh)
    export MCP_EVENT_STORE_POSTGRES_IMAGE MCP_EVENT_STORE_REDIS_IMAGE MCP_EVENT_STORE_NATS_IMAGE
    MCP_EVENT_STORE_POSTGRES_IMAGE=$(sed -n 1p <<<"$images")
    MCP_EVENT_STORE_REDIS_IMAGE=$(sed -n 2p <<<"$images")
    MCP_EVENT_STORE_NATS_IMAGE=$(sed -n 3p <<<"$images")
}

# The backend crates whose test server the images built here stand in for:
# those whose test support reads one of the image variables (no list of
# backends here).
IMAGE_VARS=(MCP_EVENT_STORE_POSTGRES_IMAGE MCP_EVENT_STORE_REDIS_IMAGE MCP_EVENT_STORE_NATS_IMAGE)
server_crates() {
    local pattern
    pattern=$(IFS='|'; echo "${IMAGE_VARS[*]}")
    grep -lE "$pattern" store-*/src/testing.rs | cut -d/ -f1 | sort -u
}

# The test executables of the server-backed backend crates (their unit
# tests and each integration test) and the conformance crate's unit tests
# (the test kit's), as "crate dir exe".
list_tests() {
    local crates
    crates=$(server_crates | jq -R . | jq -sc .)
    [ "$crates" != "[]" ] || { echo "no backend crate reads ${IMAGE_VARS[*]}" >&2; return 1; }
    cargo test --workspace --all-features --no-run --message-format=json 2>"$work/no-run.log" \
        >"$work/artifacts.json" || { cat "$work/no-run.log" >&2; return 1; }
    if grep -q 'Blocking waiting for file lock' "$work/no-run.log"; then
        echo "(cargo waited for another build's lock on the target directory)"
    fi
    jq -r --arg root "$PWD" --argjson crates "$crates" '
            select(.reason == "compiler-artifact" and .profile.test and .executable != null)
            | (.manifest_path | ltrimstr($root + "/") | rtrimstr("/Cargo.toml")) as $dir
            | select(($crates | index($dir))
                     or ($dir == "conformance" and (.target.kind | index("lib"))))
            | [$dir, .executable] | @tsv' "$work/artifacts.json" \
        | sort >"$work/tests.tsv"
    # Nothing is rebuilt after `cargo test --workspace --all-features`.
    echo "units rebuilt: $(jq -s '[.[] | select(.reason == "compiler-artifact" and .fresh == false)] | length' "$work/artifacts.json")"
    for dir in $(server_crates) conformance; do
        grep -q "^$dir	" "$work/tests.tsv" || { echo "no test executable of $dir" >&2; return 1; }
    done
    echo "$(grep -vc '^conformance	' "$work/tests.tsv") test executables of $(server_crates | paste -sd' ')"
}

# Runs one test executable from its package's directory, as cargo does;
# shows its summary, or all it printed if it failed.
run_tests() {
    local dir=$1 exe=$2 log
    shift 2
    log="$work/logs/$dir--$(basename "$exe").log"
    mkdir -p "$work/logs"
    if ! (cd "$dir" && "$exe" "$@") >"$log" 2>&1; then
        cat "$log"
        echo "FAILED: $dir: $exe $*" >&2
        return 1
    fi
    echo "$dir $(basename "$exe"): $(grep '^test result:' "$log")"
}

run_suites() {
    local dir exe
    export MCP_EVENT_STORE_TEST_SERVER=container
    while IFS=$'\t' read -r dir exe; do
        [ "$dir" = conformance ] && continue
        run_tests "$dir" "$exe"
    done <"$work/tests.tsv"
    for dir in $(server_crates); do
        cat "$work/logs/$dir--"*.log | awk -v dir="$dir" '/^test result:/ { p += $4; i += $8 }
            END { printf "%s through containers: %d tests passed, %d ignored\n", dir, p, i }'
    done
}

run_kit_test() {
    local exe
    exe=$(awk -F'\t' '$1 == "conformance" { print $2 }' "$work/tests.tsv")
    run_tests conformance "$exe" --exact "$KIT_TEST" --ignored
    # Never a silent skip: exactly that test ran.
    grep -q '^test result: ok. 1 passed' "$work/logs/conformance--$(basename "$exe").log" \
        || { echo "$KIT_TEST did not run" >&2; return 1; }
}

# Removes every container of the tests, if an engine answers.
remove_test_containers() {
    local left
    left=$(docker ps -aq --filter "label=$LABEL" 2>/dev/null) || return 0
    [ -z "$left" ] || docker rm -f $left >/dev/null 2>&1 || true
}

# Containers an earlier run left (one stopped mid-step on a developer's
# machine) would be counted as this run's leftovers.
clear_earlier_runs() {
    local left
    left=$(docker ps -aq --filter "label=$LABEL" | wc -l)
    remove_test_containers
    echo "containers of earlier runs removed: $left"
}

# The watchdogs remove a binary's containers once it has exited.
none_left() {
    for _ in $(seq 1 300); do
        [ -z "$(docker ps -aq --filter "label=$LABEL")" ] && { echo "no container of the tests is left"; return; }
        sleep 0.1
    done
    echo "containers of the tests left after 30 s:" >&2
    docker ps -a --filter "label=$LABEL" >&2
    return 1
}

timed "install docker.io" install_docker
timed "start dockerd" start_engine
timed "build images" build_images
timed "clear earlier runs" clear_earlier_runs
timed "list the test executables" list_tests
timed "server-backed suites" run_suites
timed "test kit: containers removed" run_kit_test
timed "check for leftovers" none_left
