# psycopg 3's own test suite (pytest, pure-Python implementation), direct and through Herd.
# Sourced by scripts/compat, which provides $out, $pool_mode, $psycopg_src, $COMPAT_CACHE,
# compat_up/compat_down, compat_wait_replicas, summarize and $summary.

# psycopg_source: sets $psycopg_dir, a checkout of the psycopg repository: --psycopg-src, else
# $COMPAT_CACHE/psycopg, cloned from $PSYCOPG_REPO (default: psycopg's GitHub repository) when
# it is not there yet.
psycopg_source() {
  psycopg_dir="${psycopg_src:-$COMPAT_CACHE/psycopg}"
  if [ ! -d "$psycopg_dir/tests" ] && [ -z "$psycopg_src" ]; then
    git clone -q "${PSYCOPG_REPO:-https://github.com/psycopg/psycopg}" "$psycopg_dir" 2> /dev/null || true
  fi
  if [ ! -d "$psycopg_dir/tests" ]; then
    echo "compat: no psycopg checkout at $psycopg_dir; pass --psycopg-src DIR (a clone of psycopg/psycopg)" >&2
    return 1
  fi
  psycopg_dir="$(cd "$psycopg_dir" && pwd)"
}

# psycopg_venv: $COMPAT_CACHE/venv with this checkout's psycopg and psycopg_pool (reinstalled
# when the checkout's commit changes) and the `test` extra of psycopg/pyproject.toml, less mypy
# (the mypy tests are deselected), pytest-cov (unused) and pytest-randomly (both sides should run
# in the same order); plus pytest-timeout for the per-test bound and dnspython for the dns tests.
psycopg_venv() {
  venv="$COMPAT_CACHE/venv"
  local stamp="$venv/.psycopg-commit" commit
  commit="$(git -C "$psycopg_dir" rev-parse HEAD 2>/dev/null || echo local)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$commit" ] || [ "$commit" = local ]; then
    echo "==> psycopg: installing into $venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q --force-reinstall --no-deps "$psycopg_dir/psycopg" "$psycopg_dir/psycopg_pool"
    "$venv/bin/pip" install -q "$psycopg_dir/psycopg" "$psycopg_dir/psycopg_pool" \
      "anyio>=4.0" "pproxy>=2.7" "pytest>=6.2.5" pytest-timeout "dnspython>=2.1"
    echo "$commit" > "$stamp"
  fi
}

run_psycopg() {
  local port=$((5800 + ${COMPAT_PORT_OFFSET:-0})) side url pg_version version
  [ "$pool_mode" = session ] && port=$((port + 50))
  psycopg_source
  psycopg_venv
  version="$(git -C "$psycopg_dir" describe --tags --always 2>/dev/null || echo local),"
  version+=" commit $(git -C "$psycopg_dir" rev-parse --short HEAD 2>/dev/null || echo '?'),"
  version+=" psycopg $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("psycopg"))')"
  for side in direct herd; do
    compat_up psycopg "$port"
    pg_version="$(psql -Atc 'show server_version' "$primary")"
    if [ "$side" = herd ]; then url="$endpoint"; else url="$primary"; fi
    echo "==> psycopg $version ($side): pytest  -> $out/psycopg-$side.{xml,log}"
    # psycopg's conftest needs pytest's cache plugin: its files go to $out, not the checkout.
    (cd "$psycopg_dir" && PSYCOPG_IMPL=python timeout 3600 "$venv/bin/python" -m pytest tests \
      -m "not slow and not mypy" \
      -k "not test_leak and not test_connect_error_multi_hosts_each_message_preserved and not test_resolve_error_host" \
      --timeout 60 -p no:randomly -o cache_dir="$out/.pytest_cache" \
      --junitxml "$out/psycopg-$side.xml" --test-dsn "$url" \
      > "$out/psycopg-$side.log" 2>&1) || true
    tail -n 1 "$out/psycopg-$side.log"
    compat_down
  done
  summarize junit "psycopg $version, PSYCOPG_IMPL=python (PostgreSQL $pg_version)" \
    "$out/psycopg-direct.xml" "$out/psycopg-herd.xml"
}
