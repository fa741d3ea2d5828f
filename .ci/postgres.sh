#!/usr/bin/env bash
# Start a throw-away PostgreSQL on 127.0.0.1 for the tenancy tests and export WEIR_TEST_PG_URL.
#
# Sourced by .ci/run (also runnable on its own: `source .ci/postgres.sh`). Idempotent: a second
# run reuses the server it started before. Works on a clean Debian 12 machine as root (installs
# the `postgresql` package; the server runs as the `postgres` user) or as a normal user with
# PostgreSQL already installed. Nothing here is for production: trust auth, fsync off.

_weir_pg_main() {
  local state="${WEIR_PG_STATE_DIR:-/tmp/weir-ci-pg-$(id -u)}"
  local bindir port owner url

  if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "postgres.sh: PostgreSQL is not installed and we are not root" >&2
      return 1
    fi
    echo "postgres.sh: installing PostgreSQL from Debian packages" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  fi
  bindir="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"

  # initdb and postgres refuse to run as root: run them as the postgres user.
  if [ "$(id -u)" -eq 0 ]; then owner=postgres; else owner="$(id -un)"; fi
  _weir_pg_as() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
  }

  if [ -f "$state/port" ] && _weir_pg_as "$bindir/pg_isready" -q -h 127.0.0.1 -p "$(cat "$state/port")"; then
    port="$(cat "$state/port")"
  else
    if [ -f "$state/data/postmaster.pid" ]; then
      _weir_pg_as "$bindir/pg_ctl" -D "$state/data" -m immediate stop >/dev/null 2>&1 || true
    fi
    rm -rf "$state"
    mkdir -p "$state"
    chown "$owner" "$state"
    chmod 700 "$state"
    _weir_pg_as "$bindir/initdb" -D "$state/data" -U "$owner" --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    # Ask the kernel for a free port; fall back to a random high one without python3.
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
      2>/dev/null || shuf -i 20000-60999 -n 1)"
    _weir_pg_as "$bindir/pg_ctl" -D "$state/data" -l "$state/server.log" -w -t 60 \
      -o "-h 127.0.0.1 -p $port -k $state -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
      start >/dev/null
    _weir_pg_as "$bindir/createdb" -h 127.0.0.1 -p "$port" -U "$owner" weir_test
    echo "$port" >"$state/port"
  fi

  url="postgresql+psycopg://${owner}@127.0.0.1:${port}/weir_test"
  export WEIR_TEST_PG_URL="$url"
  echo "postgres.sh: PostgreSQL ready, WEIR_TEST_PG_URL=$WEIR_TEST_PG_URL" >&2
}

_weir_pg_main
unset -f _weir_pg_main _weir_pg_as
