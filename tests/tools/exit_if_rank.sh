#!/bin/sh
# exit_if_rank.sh R CODE command [args...] — for the launcher tests: the process with RANK=R exits
# with CODE at once (a rank that never starts); every other rank runs the command.
r="$1"; code="$2"; shift 2
if [ "${RANK:-}" = "$r" ]; then exit "$code"; fi
exec "$@"
