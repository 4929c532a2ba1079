#!/usr/bin/env bash
# Run "$@" inside one ROCm image the way vLLM's AMD test runner starts its containers: /dev/kfd plus only
# this agent's render devices (Buildkite agent metadata render-devices, else BISECTOR_RENDER_DEVICES as a
# GitHub runner's .env sets it), the host's numeric render group and video,
# no core dumps (every bad step is a GPU fault), host IPC and a large /dev/shm. bisector is installed
# from BISECTOR_SPEC (on the host through host-bisector.sh for the flags, and in the container);
# HIP_VISIBLE_DEVICES is not passed: the container sees exactly the agent's GPUs. For per-commit images
# (--image), run bisector on the host with host-bisector.sh instead.
# Used by the Buildkite pipelines beside this file and the GitHub workflows; BISECTOR_SPEC, BISECTOR_IMAGE
# and BISECTOR_VOLUME come from the build's environment.
set -euo pipefail
me=rocm-container.sh

# vLLM's AMD container flags come from bisector itself (python -m bisector.world.images flags), the same code that
# starts each step's container under --image: one implementation. It says in one line what is missing.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
errors=$(mktemp)
if ! flags_text=$("$here/host-bisector.sh" python -m bisector.world.images flags 2>"$errors"); then
    echo "$me: $(tail -n 1 "$errors")" >&2
    rm -f "$errors"
    exit 1
fi
rm -f "$errors"
mapfile -t flags <<< "$flags_text"

volume=${BISECTOR_VOLUME:-/var/lib/bisector}
mkdir -p "$volume"
exec docker run --rm "${flags[@]}" \
  -v "$volume:/var/lib/bisector" -v "$PWD:/workdir" -w /workdir \
  -e BISECTOR_STATE_DIR=/var/lib/bisector/state -e CCACHE_DIR=/var/lib/bisector/ccache \
  -e PIP_CACHE_DIR=/var/lib/bisector/pip -e BISECTOR_SPEC \
  "${BISECTOR_IMAGE:-rocm/vllm-dev:nightly}" \
  bash -c 'python3 -m pip install -q "$BISECTOR_SPEC" && bisector doctor --repo . && "$@"' bash "$@"
