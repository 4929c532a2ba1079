#!/usr/bin/env bash
# Run bisector on this agent itself (not in a container): `host-bisector.sh bisector ARGS...`, or
# `host-bisector.sh python ARGS...` for the same install's Python. With --image, bisector starts each step
# in that commit's own image (vLLM's AMD CI images, rocm/vllm-ci:<sha>) with vLLM's AMD container flags and
# this agent's render devices (Buildkite agent metadata render-devices, else BISECTOR_RENDER_DEVICES), so it
# needs the host's docker, git and python3 (>= 3.10). The pinned BISECTOR_SPEC is installed once into a
# virtual environment under BISECTOR_VOLUME (one per spec); the record lives in $BISECTOR_VOLUME/state.
set -euo pipefail
me=host-bisector.sh

case ${BISECTOR_SPEC:-} in
    "bisector @ git+https://"*@?*) ;;
    *) echo "$me: set BISECTOR_SPEC to 'bisector @ git+https://HOST/OWNER/bisector@TAG-OR-SHA' (got '${BISECTOR_SPEC:-}')" >&2
       exit 1 ;;
esac
case ${1:-} in
    bisector|python) ;;
    *) echo "$me: usage: $me bisector ARGS... | $me python ARGS..." >&2
       exit 2 ;;
esac
volume=${BISECTOR_VOLUME:-/var/lib/bisector}
venv="$volume/venvs/$(printf '%s' "$BISECTOR_SPEC" | sha256sum | cut -c1-16)"
if [[ ! -x $venv/bin/bisector ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q "$BISECTOR_SPEC"
fi
export BISECTOR_STATE_DIR=${BISECTOR_STATE_DIR:-$volume/state}
program=$1
shift
exec "$venv/bin/$program" "$@"
