#!/usr/bin/env bash
# cgroup_run.sh LIMIT_BYTES -- CMD ARGS...
#
# Owns: running one Guanaco test command under a hard memory limit (cgroup v1 memory
# controller), cold page cache for the model, and reporting what the kernel saw, so the
# streaming tests can show that expert pages were dropped and faulted back in without the
# logits changing.
#
#   env GUANACO_EVICT_FILES  space-separated files whose page cache is dropped before CMD runs
#   env GUANACO_EVICT_TOOL   path of the tests/evict_file helper (needed iff EVICT_FILES is set)
#
# Prints after the run (stdout, last line):
#   cgroup: limit=L max_usage=M failcnt=F pgmajfault=P read_bytes=R oom_kill=K rc=RC
#     max_usage/failcnt/pgmajfault come from the cgroup's memory.* files. failcnt > 0 would mean
#     the limit was hit, but it reads 0 on some kernels (seen on 6.18, even for an OOM kill), so
#     callers should treat max_usage == limit or read_bytes as the evidence instead. read_bytes is the storage I/O (bytes actually
#     submitted to the block layer, /proc/PID/io) of CMD and all its reaped descendants: the
#     kernel folds a child's I/O counters into its parent on wait(), so the wrapper subshell's
#     own counter, read before and after, gives CMD's total even after CMD has exited.
# Exit status: CMD's exit status (128+N if it died from signal N, e.g. 137 for OOM kill);
#   77 with "SKIP: reason" when cgroup v1 memory is unavailable (ctest SKIP_RETURN_CODE);
#   2 on usage/setup errors.
#
# The cgroup is created as a child of the caller's own memory cgroup (which is the root when
# the caller is in the root, giving /sys/fs/cgroup/memory/guanaco-test-PID-RAND exactly): nesting
# keeps any limit/accounting already imposed on the caller in force instead of escaping it.
# It is always removed on exit (trap), including on failure or signals.

# shellcheck disable=SC2317  # cleanup/forward are only reached through traps
set -u

CG_MNT=/sys/fs/cgroup/memory

usage() {
    echo "usage: cgroup_run.sh LIMIT_BYTES -- CMD ARGS..." >&2
    exit 2
}

[ $# -ge 3 ] || usage
LIMIT=$1
shift
[ "$1" = "--" ] || usage
shift
case "$LIMIT" in
    ''|*[!0-9]*) echo "cgroup_run: LIMIT_BYTES must be a positive integer, got '$LIMIT'" >&2; exit 2 ;;
esac
[ "$LIMIT" -gt 0 ] || { echo "cgroup_run: LIMIT_BYTES must be > 0" >&2; exit 2; }

skip() {
    echo "SKIP: $*"
    exit 77
}

# --- is cgroup v1 memory usable? ---------------------------------------------------------
# A v1 memory hierarchy shows up in /proc/mounts as fstype "cgroup" with option "memory".
awk -v m="$CG_MNT" '$2 == m && $3 == "cgroup" && $4 ~ /(^|,)memory(,|$)/ { found = 1 } END { exit !found }' /proc/mounts \
    || skip "cgroup v1 memory controller is not mounted at $CG_MNT"
[ "$(id -u)" = 0 ] || skip "not root (cgroup v1 directories are root-owned)"

# The caller's memory cgroup path, relative to the mount ("4:memory:/a/b" -> "/a/b").
SELF_CG=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3; exit }' /proc/self/cgroup)
PARENT="$CG_MNT${SELF_CG:-}"
PARENT=${PARENT%/}
# In a cgroup namespace the path may not resolve under our mount; fall back to the root.
[ -d "$PARENT" ] && [ -w "$PARENT" ] || PARENT=$CG_MNT
[ -w "$PARENT" ] || skip "$PARENT is not writable"

CG="$PARENT/guanaco-test-$$-$RANDOM"

IO_FILE=
cleanup() {
    local rc=$?
    # ignore (not reset) further signals: timeout(1) also signals our whole process group,
    # and a second TERM arriving mid-cleanup must not kill us before rmdir
    trap "" INT TERM HUP
    trap - EXIT
    [ -n "$IO_FILE" ] && rm -f "$IO_FILE"
    if [ -d "$CG" ]; then
        # "Move out": anything still in the cgroup (a daemonized grandchild, or the wrapper
        # subshell if we were interrupted mid-run) goes back to the parent so rmdir can succeed.
        local pid tries=0
        while [ -s "$CG/cgroup.procs" ] && [ "$tries" -lt 50 ]; do
            while read -r pid; do
                echo "$pid" > "$PARENT/cgroup.procs" 2>/dev/null || true
            done < "$CG/cgroup.procs"
            tries=$((tries + 1))
            sleep 0.1
        done
        # rmdir of an empty v1 memcg reparents its remaining page-cache charges; retry briefly
        # because a task that just exited can linger in cgroup.procs for a moment.
        tries=0
        until rmdir "$CG" 2>/dev/null; do
            tries=$((tries + 1))
            if [ "$tries" -ge 50 ]; then
                echo "cgroup_run: WARNING: could not remove $CG" >&2
                break
            fi
            sleep 0.1
        done
    fi
    exit "$rc"
}
# On a signal (e.g. `timeout` firing) pass it on to everything in our cgroup -- by
# construction only the processes this script started -- then exit; cleanup runs from EXIT.
forward() {
    local sig=$1 code=$2 pid
    if [ -r "$CG/cgroup.procs" ]; then
        while read -r pid; do
            kill "-$sig" "$pid" 2>/dev/null || true
        done < "$CG/cgroup.procs"
        [ -n "${CHILD:-}" ] && wait "$CHILD" 2>/dev/null
    fi
    exit "$code"
}
CHILD=
trap cleanup EXIT
trap 'forward INT 130' INT
trap 'forward TERM 143' TERM
trap 'forward HUP 129' HUP

mkdir "$CG" 2>/dev/null || skip "cannot create a cgroup under $PARENT"

# memsw (memory+swap) must be >= memory's limit, and memory's limit must be set first when
# lowering. Setting both to the same value forbids swapping the anonymous memory out, so the
# limit really bounds RAM + swap and the test can't "pass" by swapping.
if ! echo "$LIMIT" > "$CG/memory.limit_in_bytes" 2>/dev/null; then
    echo "cgroup_run: cannot write memory.limit_in_bytes=$LIMIT in $CG" >&2
    exit 2
fi
if [ -e "$CG/memory.memsw.limit_in_bytes" ]; then
    if ! echo "$LIMIT" > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null; then
        echo "cgroup_run: cannot write memory.memsw.limit_in_bytes=$LIMIT in $CG" >&2
        exit 2
    fi
fi
EFFECTIVE_LIMIT=$(cat "$CG/memory.limit_in_bytes")   # kernel rounds to the page size

# --- cold cache ----------------------------------------------------------------------------
# Targeted eviction (posix_fadvise DONTNEED) rather than drop_caches: only the model's pages
# go, so the run reads them from disk without disturbing the rest of the machine.
if [ -n "${GUANACO_EVICT_FILES:-}" ]; then
    if [ -z "${GUANACO_EVICT_TOOL:-}" ] || [ ! -x "${GUANACO_EVICT_TOOL}" ]; then
        echo "cgroup_run: GUANACO_EVICT_FILES is set but GUANACO_EVICT_TOOL ('${GUANACO_EVICT_TOOL:-}') is not an executable" >&2
        exit 2
    fi
    # shellcheck disable=SC2086 # the list is space-separated by contract
    "$GUANACO_EVICT_TOOL" $GUANACO_EVICT_FILES >&2 || { echo "cgroup_run: eviction failed" >&2; exit 2; }
fi

# --- run ------------------------------------------------------------------------------------
IO_FILE=$(mktemp "${TMPDIR:-/tmp}/cgroup_run-io.XXXXXX") || exit 2   # removed by cleanup
read_bytes_of() {   # $1 = pid; prints read_bytes from /proc/PID/io, builtins only
    local k v
    while read -r k v; do
        [ "$k" = "read_bytes:" ] && { echo "$v"; return; }
    done < "/proc/$1/io"
    echo 0
}

# The subshell moves itself into the cgroup, then runs CMD as its child (not exec) so that
# after CMD is reaped, its I/O counters are folded into the subshell's and can be read.
# Its own reads (bash is already in memory) are negligible.
# It runs in the background + `wait` because bash only runs traps between commands: a
# foreground child would make a TERM from `timeout` wait for CMD to finish on its own.
# `0<&0` keeps CMD's stdin (a non-interactive background job would get /dev/null).
(
    trap - INT TERM HUP
    me=$BASHPID   # captured here: inside $(...) BASHPID would name the substitution's child
    echo "$me" > "$CG/cgroup.procs" || { echo "cgroup_run: cannot move into $CG" >&2; exit 2; }
    before=$(read_bytes_of "$me")
    "$@"
    rc=$?
    after=$(read_bytes_of "$me")
    echo "$((after - before))" > "$IO_FILE"
    exit "$rc"
) 0<&0 &
CHILD=$!
wait "$CHILD"
RC=$?
CHILD=

READ_BYTES=$(cat "$IO_FILE" 2>/dev/null)
[ -n "$READ_BYTES" ] || READ_BYTES=unknown   # subshell itself was killed (OOM) before writing

stat_field() {   # $1 = key in memory.stat / memory.oom_control
    awk -v k="$1" '$1 == k { print $2; found = 1; exit } END { if (!found) print "n/a" }' "$2"
}
MAX_USAGE=$(cat "$CG/memory.max_usage_in_bytes")
FAILCNT=$(cat "$CG/memory.failcnt")
MEMSW_FAILCNT=$(cat "$CG/memory.memsw.failcnt" 2>/dev/null || echo n/a)
PGMAJ=$(stat_field pgmajfault "$CG/memory.stat")
OOMK=$(stat_field oom_kill "$CG/memory.oom_control")

echo "cgroup: limit=$EFFECTIVE_LIMIT max_usage=$MAX_USAGE failcnt=$FAILCNT memsw_failcnt=$MEMSW_FAILCNT pgmajfault=$PGMAJ read_bytes=$READ_BYTES oom_kill=$OOMK rc=$RC"
exit $RC
