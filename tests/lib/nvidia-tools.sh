# shellcheck shell=bash
# nvidia_tool NAME: the path of NVIDIA's NAME (nvidia-ctk, nvidia-cdi-hook), the oracle of the
# tests, looked up as tests/common/mod.rs does: $NVIDIA_CTK_DIR/NAME ($NVIDIA_CTK for nvidia-ctk),
# ../shared/tools/nvidia-container-toolkit/ beside this repository, then PATH. Not found: one
# message naming the three ways and the version to install, on stderr, and status 1.
NVIDIA_TOOLKIT_VERSION="1.20.0 (commit d34b3046758c)"
nvidia_tool() {
    local name=$1 c here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    for c in ${NVIDIA_CTK:+$([ "$name" = nvidia-ctk ] && echo "$NVIDIA_CTK")} \
        ${NVIDIA_CTK_DIR:+$NVIDIA_CTK_DIR/$name} "$here/../shared/tools/nvidia-container-toolkit/$name" \
        "$(command -v "$name" 2>/dev/null)"; do
        [ -n "$c" ] && [ -f "$c" ] && [ -x "$c" ] && { printf '%s\n' "$c"; return 0; }
    done
    echo "NVIDIA's $name is the tests' oracle and was not found: set NVIDIA_CTK_DIR (or NVIDIA_CTK) to where it is, put NVIDIA's container toolkit beside this repository at ../shared/tools/nvidia-container-toolkit/, or install the nvidia-container-toolkit package, version $NVIDIA_TOOLKIT_VERSION or later, so it is on PATH" >&2
    return 1
}
