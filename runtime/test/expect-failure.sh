#!/bin/bash
# usage: expect-failure.sh SECONDS TEXT COMMAND...
#
# Passes when COMMAND exits non-zero within SECONDS and its output (stdout and
# stderr) contains TEXT, a fixed string. For the tests of failures that must
# end the whole job: a timeout, a killed peer, a bad launch.
seconds=$1 text=$2
shift 2
start=$(date +%s%N)
output=$(timeout -k 5 "$((seconds + 30))" "$@" 2>&1)
status=$?
ms=$((($(date +%s%N) - start) / 1000000))
printf '%s\n' "$output"
echo "-- exit status $status after $ms ms"
if [ "$status" -eq 0 ]; then
  echo "FAIL: expected a non-zero exit status"; exit 1
fi
# (137 is also how mpirun reports a rank killed by SIGKILL.)
if [ "$ms" -gt "$((seconds * 1000))" ]; then
  echo "FAIL: took longer than $seconds s"; exit 1
fi
if ! grep -qF -- "$text" <<<"$output"; then
  echo "FAIL: the output does not contain: $text"; exit 1
fi
