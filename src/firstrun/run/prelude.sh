# ---- firstrun check helpers ------------------------------------------------
# Mechanism only: what counts as success is whatever this task asserts below.
# QS_PORT is the task's own port (stable per task name, so a failure can be
# reproduced by hand); QS_SESSION_LOG holds what the agent's successful
# commands printed, written by the harness before this script starts.
export QS_PORT
case "${QS_SESSION_LOG:-}" in
  /*|'') ;;
  *) QS_SESSION_LOG="$PWD/$QS_SESSION_LOG" ;;
esac

qs_fail() {
  printf 'check failed: %s\n' "$*"
  exit 1
}

_qs_dir=$(mktemp -d "${TMPDIR:-/tmp}/firstrun-check.XXXXXX") \
  || { printf 'check failed: cannot create a temporary directory\n'; exit 1; }
QS_SERVE_LOG="$_qs_dir/serve.log"
_qs_body="$_qs_dir/body"
# Process groups qs_serve started, one per line. A file, not a variable, so a
# server started inside the task's own script (a subshell) is killed too.
_qs_groups="$_qs_dir/groups"
: > "$_qs_groups"

_qs_cleanup() {
  local g
  while read -r g; do kill -TERM -- "-$g" 2>/dev/null; done < "$_qs_groups"
  sleep 0.2
  while read -r g; do kill -KILL -- "-$g" 2>/dev/null; done < "$_qs_groups"
  rm -rf "$_qs_dir"
}
trap _qs_cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# Background a long-running command in its own process group, its output in
# $QS_SERVE_LOG, killed with everything it started when the check ends.
#   qs_serve python3 -m http.server "$QS_PORT"
qs_serve() {
  [ $# -gt 0 ] || qs_fail "qs_serve: no command given"
  if command -v setsid >/dev/null 2>&1; then
    setsid "$@" >>"$QS_SERVE_LOG" 2>&1 </dev/null &
  else
    set -m
    "$@" >>"$QS_SERVE_LOG" 2>&1 </dev/null &
    set +m
  fi
  printf '%s\n' "$!" >> "$_qs_groups"
}

_qs_serve_log_tail() {
  if [ -s "$QS_SERVE_LOG" ]; then
    printf -- '--- server log (last 30 lines) ---\n'
    tail -n 30 "$QS_SERVE_LOG"
    printf -- '----------------------------------\n'
  elif [ -s "$_qs_groups" ]; then
    printf -- '(the server printed nothing)\n'
  fi
}

# One GET: the body into $_qs_body, the status into _qs_code; non-zero when
# no answer came, with the reason in _qs_why. Uses what the sandbox has, each
# told to read no configuration of the user's (curl -q: no .curlrc; python3
# -I: no user site-packages or PYTHON* variables), so nothing the agent left
# in HOME can change what the check sees.
_qs_get() {
  _qs_code=""
  _qs_why=""
  : > "$_qs_body"
  if command -v curl >/dev/null 2>&1; then
    _qs_code=$(curl -q -sS -o "$_qs_body" -w '%{http_code}' --max-time 10 -- "$1" 2>"$_qs_dir/err") \
      || { _qs_why="$(tail -n 1 "$_qs_dir/err")"; return 1; }
  elif command -v python3 >/dev/null 2>&1; then
    _qs_code=$(python3 -I - "$1" "$_qs_body" 2>"$_qs_dir/err" <<'PY'
import sys
import urllib.error
import urllib.request

url, out = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(url, timeout=10) as response:
        status, body = response.status, response.read()
except urllib.error.HTTPError as exc:
    status, body = exc.code, exc.read()
except Exception as exc:
    sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
    sys.exit(1)
with open(out, "wb") as fh:
    fh.write(body)
print(status)
PY
    ) || { _qs_why="$(tail -n 1 "$_qs_dir/err")"; return 1; }
  elif command -v node >/dev/null 2>&1; then
    _qs_code=$(node -e '
      const [url, out] = process.argv.slice(1);
      fetch(url, { signal: AbortSignal.timeout(10000) })
        .then(async (r) => {
          require("fs").writeFileSync(out, Buffer.from(await r.arrayBuffer()));
          console.log(r.status);
        })
        .catch((e) => { console.error(String(e.cause || e)); process.exit(1); });
    ' "$1" "$_qs_body" 2>"$_qs_dir/err") \
      || { _qs_why="$(tail -n 1 "$_qs_dir/err")"; return 1; }
  else
    qs_fail "no way to make an HTTP request here (no curl, python3 or node)"
  fi
}

# Text as an extended regular expression that matches only itself.
_qs_ere() {
  printf '%s' "$1" | sed -e 's/[]\/$*.^|()+?{}[]/\\&/g'
}

# Poll until the endpoint answers as this task says it should.
#   qs_wait_http /health --contains ok
#   qs_wait_http http://127.0.0.1:8080/items/1 --status 200 --json id=1 --timeout 60
# A bare path is resolved against http://127.0.0.1:$QS_PORT. --json KEY=VALUE
# is matched as text (tolerant of spacing and quoting), not parsed.
qs_wait_http() {
  [ $# -gt 0 ] || qs_fail "qs_wait_http: no path or URL given"
  local target="$1" url want=200 timeout=40 last="no attempt finished" pats="" pat kind text
  shift
  case "$target" in
    http://*|https://*) url="$target" ;;
    /*) url="http://127.0.0.1:${QS_PORT}${target}" ;;
    *) url="http://127.0.0.1:${QS_PORT}/${target}" ;;
  esac
  command -v grep >/dev/null 2>&1 || qs_fail "qs_wait_http needs grep, which is not here"
  # Criteria as "F<text>" (literal) or "E<regex>" lines, checked in order.
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || qs_fail "qs_wait_http: $1 needs a value"
    case "$1" in
      --status) want="$2" ;;
      --timeout) timeout="$2" ;;
      --contains) pats="${pats}F$2"$'\n' ;;
      --matches) pats="${pats}E$2"$'\n' ;;
      --json)
        case "$2" in *=*) ;; *) qs_fail "qs_wait_http: --json wants KEY=VALUE, got $2" ;; esac
        pat="\"$(_qs_ere "${2%%=*}")\"[[:space:]]*:[[:space:]]*\"?$(_qs_ere "${2#*=}")\"?([[:space:]]*[],}]|\$)"
        pats="${pats}E${pat}"$'\n' ;;
      *) qs_fail "qs_wait_http: unknown option $1" ;;
    esac
    shift 2
  done
  local deadline=$((SECONDS + timeout))
  while :; do
    if _qs_get "$url"; then
      if [ "$_qs_code" != "$want" ]; then
        last="HTTP $_qs_code, wanted $want; body: $(head -c 300 "$_qs_body")"
      else
        local missing=""
        while IFS= read -r pat; do
          [ -n "$pat" ] || continue
          kind="${pat:0:1}"
          text="${pat:1}"
          if [ "$kind" = F ]; then
            grep -qF -- "$text" "$_qs_body" || { missing="text '$text'"; break; }
          else
            grep -qE -- "$text" "$_qs_body" || { missing="pattern /$text/"; break; }
          fi
        done <<< "$pats"
        [ -z "$missing" ] && return 0
        last="HTTP $_qs_code but the body lacks $missing; body: $(head -c 300 "$_qs_body")"
      fi
    else
      last="no answer: ${_qs_why:-connection failed}"
    fi
    [ "$SECONDS" -lt "$deadline" ] || break
    sleep 0.5
  done
  _qs_serve_log_tail
  qs_fail "$url did not answer as expected within ${timeout}s; last attempt: $last"
}

# Assert on what the agent's commands printed (those that exited 0; setup's
# output and the commands themselves are not in it).
#   qs_expect_output --contains 35.75 --matches '^total: [0-9]+$'
qs_expect_output() {
  [ -n "${QS_SESSION_LOG:-}" ] && [ -f "$QS_SESSION_LOG" ] \
    || qs_fail "no record of the run's output (QS_SESSION_LOG is not set)"
  command -v grep >/dev/null 2>&1 || qs_fail "qs_expect_output needs grep, which is not here"
  [ $# -gt 0 ] || qs_fail "qs_expect_output: give --contains TEXT or --matches REGEX"
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || qs_fail "qs_expect_output: $1 needs a value"
    [ -n "$2" ] || qs_fail "qs_expect_output: an empty pattern matches anything"
    case "$1" in
      --contains) grep -qF -- "$2" "$QS_SESSION_LOG" && { shift 2; continue; } ;;
      --matches) grep -qE -- "$2" "$QS_SESSION_LOG" && { shift 2; continue; } ;;
      *) qs_fail "qs_expect_output: unknown option $1" ;;
    esac
    printf -- '--- the run printed (last 20 lines) ---\n'
    tail -n 20 "$QS_SESSION_LOG"
    printf -- '---------------------------------------\n'
    qs_fail "nothing the run printed matches ${1#--} '$2'"
  done
}
# ---- end of firstrun check helpers -----------------------------------------
