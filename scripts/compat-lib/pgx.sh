# pgx v5's own test suite (`go test ./...`), direct and through Herd. Sourced by scripts/compat,
# which provides $out, $pool_mode, $pgx_src, $COMPAT_CACHE, compat_up/compat_down,
# compat_wait_replicas, with_database, summarize and $summary.

# pgx_source: sets $pgx_dir (the module's source tree, tests included) and $pgx_version.
# --pgx-src wins; otherwise the newest v5 from the Go module proxy, kept in $COMPAT_CACHE/pgx.
pgx_source() {
  if [ -n "$pgx_src" ]; then
    pgx_dir="$(cd "$pgx_src" && pwd)"
    pgx_version="$(git -C "$pgx_dir" describe --tags --always 2>/dev/null || echo "local tree $pgx_dir")"
    return
  fi
  pgx_dir="$COMPAT_CACHE/pgx"
  if [ ! -f "$pgx_dir/go.mod" ] || [ ! -f "$pgx_dir/.compat-version" ]; then
    echo "==> pgx: fetching github.com/jackc/pgx/v5@latest from the Go module proxy"
    local tmp dir version
    tmp="$(mktemp -d)"
    (cd "$tmp" && go mod init compat > /dev/null 2>&1 \
      && go mod download -json github.com/jackc/pgx/v5@latest > mod.json)
    dir="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Dir"])' "$tmp/mod.json")"
    version="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Version"])' "$tmp/mod.json")"
    rm -rf "$pgx_dir" "$tmp"
    cp -r "$dir" "$pgx_dir"
    chmod -R u+w "$pgx_dir"  # the module cache is read-only; tests write files (e.g. certs)
    echo "$version" > "$pgx_dir/.compat-version"
  fi
  pgx_version="$(cat "$pgx_dir/.compat-version")"
}

# pgx_prepare_db: what pgx's CI does (ci/setup_test.bash) on the primary, directly: database
# pgx_test, then testsetup/postgresql_setup.sql in it (extensions hstore and ltree, domain
# uint64, the pgx_* roles, a role named after the OS user, the "tricky" role).
pgx_prepare_db() {
  psql -q -v ON_ERROR_STOP=1 "$primary" -c "create database pgx_test" > /dev/null
  psql -q "$(with_database "$primary" pgx_test)" -f "$pgx_dir/testsetup/postgresql_setup.sql" \
    > "$out/pgx-setup.log" 2>&1 || true
  if grep -q ERROR "$out/pgx-setup.log"; then
    echo "compat: warning: pgx's setup SQL reported errors (see $out/pgx-setup.log)" >&2
  fi
  compat_wait_replicas
}

run_pgx() {
  command -v go > /dev/null || { echo "compat: pgx needs Go" >&2; return 1; }
  command -v psql > /dev/null || { echo "compat: pgx's database setup needs psql" >&2; return 1; }
  local port=$((6800 + ${COMPAT_PORT_OFFSET:-0})) side url pg_version
  [ "$pool_mode" = session ] && port=$((port + 50))
  pgx_source
  (cd "$pgx_dir" && go mod download)  # dependencies before the clock starts
  for side in direct herd; do
    compat_up pgx "$port"
    pgx_prepare_db
    pg_version="$(psql -Atc 'show server_version' "$primary")"
    local env=()
    if [ "$side" = herd ]; then
      url="$(with_database "$endpoint" pgx_test)"
      # The endpoint stands in for PgBouncer: pgx's pgbouncer tests run on the Herd side only.
      env=(PGX_TEST_PGBOUNCER_CONN_STRING="$url")
    else
      url="$(with_database "$primary" pgx_test)"
    fi
    echo "==> pgx $pgx_version ($side): go test ./...  -> $out/pgx-$side.json"
    (cd "$pgx_dir" && env PGX_TEST_DATABASE="$url" "${env[@]}" timeout 3600 \
      go test -count=1 -p 1 -timeout 20m -json \
        -skip 'TestConnectFailsWithResolveFailureAndFailedConnectionAttempts' ./... \
      > "$out/pgx-$side.json" 2> "$out/pgx-$side.stderr") || true
    compat_down
  done
  summarize go "pgx $pgx_version (PostgreSQL $pg_version)" "$out/pgx-direct.json" "$out/pgx-herd.json"
}
