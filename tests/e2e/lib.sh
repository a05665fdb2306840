# Shared by the end-to-end scripts (sourced). The caller sets `work`, its scratch folder whose
# *.log files a failure shows, and `tag`, what its FAIL lines name.

fail() {
  echo "FAIL [$tag]: $*" >&2
  for f in "$work"/*.log; do
    [[ -f $f ]] || continue
    echo "--- $f (last 25 lines)" >&2
    tail -n 25 "$f" >&2
  done
  exit 1
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND until it succeeds, fails the test after SECONDS.
wait_for() {
  local seconds=$1 what=$2
  shift 2
  local end=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || fail "timed out after ${seconds}s waiting for $what"
    sleep 0.2
  done
}

# free_port: a loopback port nothing listens on now.
free_port() {
  local port
  for ((port = 20000 + RANDOM % 30000; ; port++)); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
}

# listening_port LOG: the gRPC port a hyscaled logging to LOG listens on ("listening on HOST:PORT").
listening_port() { grep -oE "listening on 127\.0\.0\.1:[0-9]+" "$1" | head -1 | sed 's/.*://'; }

# trainer_user TRAINER: the user a root worker's trainers run as here. nobody (the agent's default
# under root) where nobody can start TRAINER; where a folder above the build is closed to others (a
# clone under a 0700 home), this user, with a note.
trainer_user() {
  if (($(id -u) == 0)) && ! runuser -u nobody -- "$1" --help >/dev/null 2>&1; then
    echo "e2e: nobody cannot start $1 (a folder above it is closed to others): trainers run as $(id -un)" >&2
  elif (($(id -u) == 0)); then
    echo nobody
    return
  fi
  id -un
}
