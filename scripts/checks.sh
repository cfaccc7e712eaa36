# The check runner of scripts/image-test.sh and scripts/deploy-check.sh
# (sourced, with `set -euo pipefail` in force). Each check is a function;
# they run in order, each needing the ones before it, and never inside `if`,
# so any failing command ends the run (`fail` says why). A check's output
# is shown only when it fails; it and those after it count as failed, in
# the `PREFIX: N passed, M failed` line that scripts/test.sh adds up.
# A script may define `on_check_failure` to print more (a container's log).

fail() { echo "$*"; return 1; }

# run_checks PREFIX WORKDIR CLEANUP "description|function"...: CLEANUP is
# the command the script's EXIT trap runs; the report of a failure comes
# first.
run_checks() {
    checks_prefix=$1
    checks_work=$2
    checks_cleanup=$3
    shift 3
    checks_total=$#
    checks_passed=0
    checks_current=
    # The EXIT trap may run while a failed check's output still goes to
    # check.out: the report writes to fd 3, the script's own stdout.
    exec 3>&1
    trap '_checks_report; '"$checks_cleanup" EXIT
    local entry started
    for entry in "$@"; do
        checks_current=${entry%%|*}
        started=$(date +%s)
        "${entry##*|}" >"$checks_work/check.out" 2>&1
        echo "$checks_prefix: ok      $checks_current ($(($(date +%s) - started))s)"
        checks_passed=$((checks_passed + 1))
    done
    trap "$checks_cleanup" EXIT
}

_checks_report() {
    {
        echo "$checks_prefix: FAILED  $checks_current"
        sed 's/^/    /' "$checks_work/check.out"
        if declare -F on_check_failure >/dev/null; then on_check_failure 2>&1 | sed 's/^/    /'; fi
        echo "$checks_prefix: $checks_passed passed, $((checks_total - checks_passed)) failed"
    } >&3
}
