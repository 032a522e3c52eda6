#!/usr/bin/env bash
# Builds the three images the container-backed tests start, from the Debian
# packages already installed on this machine (postgresql-15, redis-server,
# nats-server):
# each image's root file system is the server binary, its data files and
# the shared libraries it links (its `ldd` closure), and nothing else. No
# image registry is needed, and no download: about ten seconds, where a
# root file system bootstrapped from the Debian mirror takes minutes.
#
#   mcp-event-store-test/postgres:15-debian  PostgreSQL 15, a cluster made
#       at build time (trust authentication, locale C.UTF-8), run as the
#       `postgres` user, logging to stderr;
#   mcp-event-store-test/redis:7.0-debian    Redis 7.0, no persistence, no
#       protected mode, run as the `redis` user, logging to stdout;
#   mcp-event-store-test/nats:2.9-debian     NATS 2.9 (the entry point
#       `nats-server`; the tests pass `-js`), run as the `nats` user,
#       storing under /tmp, logging to stderr.
#
# They are tagged for what they are, not as the official images; the tests
# start them when told to (the test kit's image variables):
#
#   MCP_EVENT_STORE_POSTGRES_IMAGE=mcp-event-store-test/postgres:15-debian
#   MCP_EVENT_STORE_REDIS_IMAGE=mcp-event-store-test/redis:7.0-debian
#   MCP_EVENT_STORE_NATS_IMAGE=mcp-event-store-test/nats:2.9-debian
#
# Idempotent: an image built from the same package version by the same
# script is kept. Needs root (the cluster is made as the `postgres` user),
# Docker and the three packages (`apt-get install postgresql-15
# redis-server nats-server`). Prints the three image references when done.
set -euo pipefail

PG_IMAGE=mcp-event-store-test/postgres:15-debian
REDIS_IMAGE=mcp-event-store-test/redis:7.0-debian
NATS_IMAGE=mcp-event-store-test/nats:2.9-debian
PG_PACKAGE=postgresql-15
REDIS_PACKAGE=redis-server
NATS_PACKAGE=nats-server
PG_HOME=/usr/lib/postgresql/15
# Says which packages and which build of this script an image was made
# from, so a rerun keeps an image that is still current.
KEY_LABEL=mcp-event-store.test-image.source
SCRIPT_SUM=$(sha256sum "$0" | cut -c1-16)

die() { echo "build-test-images: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (the PostgreSQL cluster is made as the postgres user)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd first)"
for package in "$PG_PACKAGE" "$REDIS_PACKAGE" "$NATS_PACKAGE"; do
    dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
        || die "the Debian package $package is not installed (apt-get install $package)"
done
getent passwd postgres >/dev/null || die "no postgres user (the $PG_PACKAGE package makes it)"
getent passwd redis >/dev/null || die "no redis user (the $REDIS_PACKAGE package makes it)"
getent passwd nats >/dev/null || die "no nats user (the $NATS_PACKAGE package makes it)"

version() { dpkg-query -W -f '${Version}' "$1"; }

# The key of an image built now, and whether $1 already carries it.
key() { echo "$1=$(version "$1") script=$SCRIPT_SUM"; }
current() {
    [ "$(docker image inspect -f "{{ index .Config.Labels \"$KEY_LABEL\" }}" "$1" 2>/dev/null)" = "$2" ]
}

stage=$(mktemp -d /tmp/mcp-event-store-test-image.XXXXXX)
trap 'rm -rf "$stage"' EXIT
# The postgres user makes the cluster inside it.
chmod 755 "$stage"

# A fresh root file system with Debian's merged-/usr layout.
new_root() {
    root="$stage/$1"
    mkdir -p "$root"/{etc,tmp,usr/bin,usr/sbin,usr/lib,usr/lib64}
    chmod 1777 "$root/tmp"
    for dir in bin sbin lib lib64; do ln -s "usr/$dir" "$root/$dir"; done
}

# Copies a file (following symbolic links) to the path it resolves to in
# the root (so /lib/x86_64-linux-gnu/libc.so.6 lands in /usr/lib/...).
add_file() {
    local dir
    dir=$(readlink -f "$(dirname "$1")")
    mkdir -p "$root$dir"
    cp -L --preserve=mode "$1" "$root$dir/$(basename "$1")"
}

# The shared libraries the given executables and modules link, and the
# dynamic loader.
add_libraries() {
    local listing
    listing=$(ldd "$@")
    if grep -q 'not found' <<<"$listing"; then
        die "unresolved libraries: $(grep 'not found' <<<"$listing" | sort -u | tr -s ' \t' ' ')"
    fi
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' <<<"$listing" \
        | sort -u | while read -r library; do add_file "$library"; done
}

# /etc/passwd and /etc/group with root and the given user, under the ids
# the user has here (the files made here are owned by them).
add_users() {
    { echo 'root:x:0:0:root:/root:/usr/sbin/nologin'; getent passwd "$1"; } >"$root/etc/passwd"
    { echo 'root:x:0:'; getent group "$(id -gn "$1")"; } >"$root/etc/group"
}

# Copies files or directories as they are to the same paths in the root.
add_tree() {
    local path
    for path in "$@"; do
        mkdir -p "$root$(dirname "$path")"
        cp -a "$path" "$root$(dirname "$path")/"
    done
}

# Imports the root as image $1 with the given --change instructions.
import() {
    local image=$1
    shift
    local changes=()
    for change in "$@"; do changes+=(--change "$change"); done
    tar -C "$root" --numeric-owner -cf - . | docker import "${changes[@]}" - "$image" >/dev/null
}

build_postgres() {
    local key
    key=$(key "$PG_PACKAGE")
    if current "$PG_IMAGE" "$key"; then
        echo "$PG_IMAGE is current ($key)" >&2
        return
    fi
    new_root postgres
    add_users postgres
    add_tree "$PG_HOME/bin/postgres"
    # The server's loadable modules (plpgsql, contrib), without the JIT
    # (it would pull in LLVM; the cluster runs with jit = off).
    mkdir -p "$root$PG_HOME/lib"
    find "$PG_HOME/lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp -a {} "$root$PG_HOME/lib/" \;
    add_tree /usr/share/postgresql/15 /usr/share/zoneinfo /usr/lib/locale/C.utf8
    add_libraries "$root$PG_HOME/bin/postgres" "$root$PG_HOME"/lib/*.so

    # The cluster, made here as the postgres user (PostgreSQL refuses to
    # run as root): anyone may connect as anyone, from anywhere, as the
    # official image's POSTGRES_HOST_AUTH_METHOD=trust allows.
    local data=/var/lib/postgresql/data
    install -d -o postgres -g "$(id -gn postgres)" -m 755 "$root/var/lib/postgresql"
    runuser -u postgres -- "$PG_HOME/bin/initdb" --pgdata="$root$data" --username=postgres \
        --auth=trust --encoding=UTF8 --locale=C.UTF-8 --no-sync >/dev/null
    cat >>"$root$data/postgresql.conf" <<'EOF'

# mcp-event-store test image
listen_addresses = '*'
unix_socket_directories = '/tmp'
jit = off
EOF
    cat >>"$root$data/pg_hba.conf" <<'EOF'
host all all 0.0.0.0/0 trust
host all all ::/0 trust
EOF
    import "$PG_IMAGE" \
        "LABEL $KEY_LABEL=\"$key\"" \
        'USER postgres' \
        "ENV PGDATA=$data" \
        'EXPOSE 5432' \
        "CMD [\"$PG_HOME/bin/postgres\", \"-D\", \"$data\"]"
    echo "$PG_IMAGE built ($key)" >&2
}

build_redis() {
    local key
    key=$(key "$REDIS_PACKAGE")
    if current "$REDIS_IMAGE" "$key"; then
        echo "$REDIS_IMAGE is current ($key)" >&2
        return
    fi
    new_root redis
    add_users redis
    # redis-server is a link to a binary that picks its role by the name
    # it was run under: copy it under the server's name.
    cp -L --preserve=mode /usr/bin/redis-server "$root/usr/bin/redis-server"
    add_libraries "$root/usr/bin/redis-server"
    import "$REDIS_IMAGE" \
        "LABEL $KEY_LABEL=\"$key\"" \
        'USER redis' \
        'WORKDIR /tmp' \
        'EXPOSE 6379' \
        'CMD ["/usr/bin/redis-server", "--bind", "0.0.0.0", "-::*", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", "/tmp"]'
    echo "$REDIS_IMAGE built ($key)" >&2
}

build_nats() {
    local key
    key=$(key "$NATS_PACKAGE")
    if current "$NATS_IMAGE" "$key"; then
        echo "$NATS_IMAGE is current ($key)" >&2
        return
    fi
    new_root nats
    add_users nats
    add_tree /usr/sbin/nats-server
    add_libraries "$root/usr/sbin/nats-server"
    # As the official image: the server is the entry point, the arguments
    # (`-js` from the tests) the command.
    import "$NATS_IMAGE" \
        "LABEL $KEY_LABEL=\"$key\"" \
        'USER nats' \
        'WORKDIR /tmp' \
        'EXPOSE 4222' \
        'ENTRYPOINT ["/usr/sbin/nats-server", "-sd", "/tmp/nats"]'
    echo "$NATS_IMAGE built ($key)" >&2
}

build_postgres
build_redis
build_nats
echo "$PG_IMAGE"
echo "$REDIS_IMAGE"
echo "$NATS_IMAGE"
