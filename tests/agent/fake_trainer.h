// A stand-in for hyscale-train: a shell script that behaves according to the job spec's name.
//   ok        job_started, 3 step events, job_finished, exit 0
//   crash     job_started, 1 step, "boom" on stderr, exit 3
//   slow      like ok but 0.3 s between steps (10 steps)
//   sleep     job_started, starts a child (its pid in <rank dir>/child.pid), sleeps
//   stubborn  like sleep but ignores SIGTERM
//   rendezvous  a context-parallel rank: rank 0 must get port 0 and publishes 29517 on its host
//             in a rendezvous event (exit 1 otherwise); other ranks echo HYSCALE_RENDEZVOUS in
//             a warning "joined <address>"
#pragma once

#include <sys/stat.h>

#include <fstream>
#include <string>

namespace hyscale::agent::testing {

inline std::string WriteFakeTrainer(const std::string& dir) {
  const std::string path = dir + "/fake-train.sh";
  std::ofstream out(path);
  out << R"SH(#!/bin/sh
config="$2"
rankdir=$(dirname "$config")
mode=$(sed -n 's/^ *"name": *"\([^"]*\)".*/\1/p' "$config" | head -n 1)
echo "fake trainer $mode: job $HYSCALE_JOB_ID rank $HYSCALE_RANK of $HYSCALE_WORLD_SIZE args $*" >&2
echo "{\"time\":1,\"job_started\":{\"name\":\"$mode\",\"total_steps\":3}}"
case "$mode" in
  crash)
    echo '{"time":1,"step":{"step":1,"total_steps":3,"loss":2.5}}'
    echo "boom" >&2
    exit 3;;
  sleep)
    sleep 1000 &
    echo $! > "$rankdir/child.pid"
    wait;;
  stubborn)
    trap '' TERM
    sleep 1000 &
    echo $! > "$rankdir/child.pid"
    wait;;
  rendezvous)
    if [ "$HYSCALE_RANK" = 0 ]; then
      case "$HYSCALE_RENDEZVOUS" in
        *:0) ;;
        *) echo "rank 0 was given $HYSCALE_RENDEZVOUS, not port 0" >&2; exit 1;;
      esac
      echo "{\"time\":1,\"rendezvous\":{\"address\":\"${HYSCALE_RENDEZVOUS%:0}:29517\",\"world_size\":$HYSCALE_WORLD_SIZE}}"
    else
      echo "{\"time\":1,\"warning\":\"joined $HYSCALE_RENDEZVOUS\"}"
    fi;;
  slow)
    i=1
    while [ $i -le 10 ]; do
      sleep 0.3
      echo "{\"time\":1,\"step\":{\"step\":$i,\"total_steps\":10,\"loss\":1.0}}"
      i=$((i + 1))
    done;;
  *)
    for i in 1 2 3; do
      echo "{\"time\":1,\"step\":{\"step\":$i,\"total_steps\":3,\"loss\":1.5}}"
    done;;
esac
echo "not json, just a log line"
echo '{"time":2,"job_finished":{"ok":true,"elapsed_seconds":1}}'
exit 0
)SH";
  out.close();
  chmod(path.c_str(), 0755);
  return path;
}

}  // namespace hyscale::agent::testing
