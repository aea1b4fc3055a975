#!/usr/bin/env bash
# A throwaway PostgreSQL server in a scratch folder, for the tests and CI:
#   postgres_server.sh start DIR     initdb DIR/data, start it, print its URL (unix socket in DIR)
#   postgres_server.sh stop DIR      stop it (the folder stays; remove it yourself)
#   postgres_server.sh restart DIR   stop and start it again (same data, same URL)
# The server listens on a socket in DIR only (no TCP), under a port number that is free on this
# host. It refuses to run as root, so as root it runs as the `postgres` user. The binaries come
# from PG_BIN, else pg_config --bindir, else /usr/lib/postgresql/<newest>/bin.
set -euo pipefail

die() { echo "postgres_server.sh: $*" >&2; exit 2; }

bindir() {
    if [[ -n "${PG_BIN:-}" ]]; then echo "$PG_BIN"; return; fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -x "$found/initdb" ]]; then echo "$found"; return; fi
    if command -v pg_config >/dev/null && [[ -x "$(pg_config --bindir)/initdb" ]]; then
        pg_config --bindir; return
    fi
    die "no PostgreSQL server binaries (initdb, pg_ctl): install PostgreSQL 15 or set PG_BIN"
}

as_owner() {  # run a command as the owner of the data folder (the postgres user when we are root)
    if [[ $(id -u) -ne 0 ]]; then "$@"; return; fi
    id postgres >/dev/null 2>&1 || die "running as root and there is no postgres user to run the server as"
    if command -v runuser >/dev/null; then runuser -u postgres -- "$@"
    else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

[[ $# -eq 2 ]] || die "usage: postgres_server.sh start|stop|restart DIR"
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
bin=$(bindir)
log="$dir/server.log"

case "$cmd" in
start)
    [[ ! -e "$dir/data" ]] || die "$dir/data exists: stop and remove that server first"
    port=$(free_port)
    if [[ $(id -u) -eq 0 ]]; then chown postgres "$dir"; fi
    as_owner "$bin/initdb" -D "$dir/data" -U opgen --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
        || die "initdb failed: $(tail -n 5 "$dir/initdb.log")"
    echo "$port" >"$dir/port"
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$log" -w -t 60 \
        -o "-p $port -k $dir -c listen_addresses='' -c fsync=off -c max_connections=200" start >/dev/null \
        || die "the server did not start: $(tail -n 5 "$log")"
    echo "postgresql://opgen@/postgres?host=$dir&port=$port"
    ;;
stop)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    ;;
restart)
    port=$(cat "$dir/port")
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$log" -m fast -w -t 60 \
        -o "-p $port -k $dir -c listen_addresses='' -c fsync=off -c max_connections=200" restart >/dev/null \
        || die "the server did not restart: $(tail -n 5 "$log")"
    ;;
*)
    die "usage: postgres_server.sh start|stop|restart DIR"
    ;;
esac
