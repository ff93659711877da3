#!/usr/bin/env bash
# The suite's verdict under load: run it N times while unrelated CPU hogs keep
# every core busy (one `python3 -c "while True: pass"` per core), and print each
# run's verdict and time. Not part of `make test`; `make stress` runs it.
#
#   tests/stress.sh                 # the whole suite (make test's pytest), 3 times
#   tests/stress.sh --marked -n 10  # only the e2e-marked tests (pytest -m e2e), 10 times
#   tests/stress.sh -n 1 -- tests/cli/test_signals.py -k second   # a selection
#
# Options: -n RUNS (default 3), --marked, --hogs K (default: one per core),
# --budget MINUTES (a run over it is reported as such; default 30), and after
# `--` the tests or pytest options to run instead of the whole suite.
# Logs: stress-logs/<date>/run-<i>.log (or STRESS_LOGS=dir). The hogs end with
# the script, however it ends (trap). Started in the background of a
# non-interactive shell (`nohup tests/stress.sh &`) it cannot trap SIGINT (bash
# keeps a signal ignored at entry ignored): stop it with `kill` (SIGTERM).
set -u

runs=3 marked=0 hogs=$(nproc) budget=30
while (($#)); do
    case $1 in
        -n) runs=$2; shift 2 ;;
        --marked) marked=1; shift ;;
        --hogs) hogs=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "stress.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
python=${PYTHON:-$root/.venv/bin/python}
logs=${STRESS_LOGS:-$root/stress-logs/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$logs"
# This checkout's sources first, also for the processes the tests start (as in a
# worktree whose .venv's editable install points elsewhere).
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
unset PYTHONDONTWRITEBYTECODE  # as make test: compile what a run imports once

args=(-q -n 2 --dist loadgroup -p no:cacheprovider)
((marked)) && args+=(-m e2e)
args+=("$@")

hog_pids=() test_pid=
stop() {  # the run in progress (if the script is stopped), then the hogs
    [[ -n $test_pid ]] && kill "$test_pid" 2>/dev/null && wait "$test_pid" 2>/dev/null
    for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${hog_pids[@]}"; do wait "$pid" 2>/dev/null; done
    hog_pids=() test_pid=
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
for ((i = 0; i < hogs; i++)); do
    python3 -c "while True: pass" &
    hog_pids+=($!)
done

echo "stress: $runs run(s) of: pytest ${args[*]}"
echo "stress: $hogs CPU hog(s) (pids ${hog_pids[*]}) on $(nproc) core(s); logs in $logs"
passed=0
for ((run = 1; run <= runs; run++)); do
    log="$logs/run-$run.log"
    start=$SECONDS
    # In the background, so that a signal to the script runs its trap at once.
    "$python" -m pytest "${args[@]}" >"$log" 2>&1 &
    test_pid=$!
    wait "$test_pid"
    rc=$? test_pid=
    took=$((SECONDS - start))
    verdict=PASSED
    ((rc)) && verdict="FAILED (exit $rc)"
    ((took > budget * 60)) && verdict="$verdict, OVER the ${budget}-min budget"
    ((rc == 0 && took <= budget * 60)) && passed=$((passed + 1))
    printf 'run %d/%d: %s in %dm%02ds: %s\n' "$run" "$runs" "$verdict" $((took / 60)) \
        $((took % 60)) "$(tail -n 1 "$log")"
    ((rc)) && grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
done
echo "stress: $passed/$runs run(s) passed within ${budget} min"
((passed == runs))
