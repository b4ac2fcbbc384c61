# shellcheck shell=bash
# qemu-aarch64 registered in binfmt_misc, so that the kernel runs every aarch64 binary through it:
# the ones a test starts, a runtime's hooks, the rig's units. Sourced by tests/aarch64/run.sh and
# tests/aarch64/e2e.sh:
#
#   binfmt_register QEMU     registers QEMU (removed again when the shell exits, whatever happened)
#
# The F (fix-binary) flag: the kernel opens the emulator now, so it runs aarch64 binaries inside
# containers and pivoted mount namespaces, whose trees do not have it. binfmt_misc is mounted
# first when it is not (these machines do not mount it; root may).
BINFMT_DIR=/proc/sys/fs/binfmt_misc
BINFMT_NAME=nspawn-lifecycle-aarch64

binfmt_unregister() {
    [ ! -e "$BINFMT_DIR/$BINFMT_NAME" ] || echo -1 >"$BINFMT_DIR/$BINFMT_NAME"
}

binfmt_register() {
    local qemu=$1
    [ -e "$BINFMT_DIR/register" ] || mount -t binfmt_misc binfmt_misc "$BINFMT_DIR"
    trap binfmt_unregister EXIT
    binfmt_unregister
    # The aarch64 ELF header (any ELF type but the low bit: executables and static-pie alike), as
    # qemu's own binfmt configuration matches it.
    printf '%s' ":$BINFMT_NAME:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:$qemu:F" \
        >"$BINFMT_DIR/register"
    echo "binfmt_misc: $(head -3 "$BINFMT_DIR/$BINFMT_NAME" | tr '\n' ' ')" >&2
}
