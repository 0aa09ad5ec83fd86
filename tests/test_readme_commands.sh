#!/usr/bin/env bash
# test_readme_commands.sh - owns the check that the README's "Two commands"
# can be run as written from a clone: each names a script that exists, is
# executable, is tracked by git with the executable bit (a clone takes the
# mode from git, not from this working tree), and parses. scripts/demo.sh was
# tracked 100644 for weeks, so the README's first command failed with
# "Permission denied" from every fresh clone while CI, which runs `bash
# scripts/test.sh`, stayed green.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
W="" # no scratch folder
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

commands=$(awk '/^## Two commands/ { on = 1; next } on && /^```sh/ { block = 1; next }
                block && /^```/ { exit } block { print $1 }' "$ROOT/README.md")
[ "$(echo "$commands" | grep -c .)" -eq 2 ]
check "the README's Two commands block names 2 commands" $? "$commands"
for cmd in $commands; do
    [ -f "$ROOT/$cmd" ] && [ -x "$ROOT/$cmd" ]
    check "$cmd exists and is executable" $? "$(ls -l "$ROOT/$cmd" 2>&1)"
    bash -n "$ROOT/$cmd"
    check "$cmd parses" $?
    if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
        mode=$(git -C "$ROOT" ls-files -s -- "$cmd" | awk '{ print $1 }')
        [ "$mode" = 100755 ]
        check "$cmd is tracked with the executable bit" $? "git mode '${mode:-untracked}'"
    fi
done
finish
