#!/usr/bin/env bash
# Usage: pick-pr-commits.sh BASE HEAD   (in the repository's checkout, which it leaves as it is)
# Cherry-picks every commit of BASE..HEAD (merges aside), oldest first, with -x onto BASE in a scratch
# worktree, folds them into one commit on BASE and prints its sha: the whole pull request as the single
# fix `bisector backport --fix` takes. A commit that does not apply fails with its sha named.
set -euo pipefail
me=pick-pr-commits.sh
base=$1 head=$2
mapfile -t commits < <(git rev-list --reverse --no-merges "$base..$head")
if [[ ${#commits[@]} -eq 0 ]]; then
    echo "$me: $head adds no commit over $base" >&2
    exit 1
fi
scratch=$(mktemp -d)
trap 'git worktree remove --force "$scratch"; rm -rf "$scratch"' EXIT
git worktree add -q --detach "$scratch" "$base"
as_bot=(-C "$scratch" -c user.name=bisector -c user.email=bisector@localhost)
for sha in "${commits[@]}"; do
    if ! git "${as_bot[@]}" cherry-pick -x "$sha" >/dev/null 2>&1; then
        echo "$me: commit $sha of the pull request does not cherry-pick cleanly onto $base (a conflict, or its change is already there)" >&2
        exit 1
    fi
done
message=$(printf 'Pull request %s..%s: %d commit(s) cherry-picked with -x\n\n' "$base" "$head" "${#commits[@]}"
          git -C "$scratch" log --reverse --format=%B "$base..HEAD")
git -C "$scratch" reset -q --soft "$base"
if git -C "$scratch" diff --cached --quiet; then
    echo "$me: the pull request changes nothing on $base" >&2
    exit 1
fi
git "${as_bot[@]}" commit -q -m "$message"
git -C "$scratch" rev-parse HEAD
