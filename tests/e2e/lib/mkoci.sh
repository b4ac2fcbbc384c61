# shellcheck shell=bash
# mkoci <out.tar> <image name> <text>: write a minimal, valid OCI image layout tarball (one
# uncompressed layer holding /hello.txt) that `ctr -n k8s.io images import` accepts. Built with
# coreutils + tar only, on the outer machine, so no registry is needed.
mkoci() {
    local out=$1 name=$2 text=$3 d
    d=$(mktemp -d)
    printf '%s\n' "$text" > "$d/hello.txt"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d" -cf "$d/layer.tar" hello.txt
    mkoci_layer "$out" "$name" "$d/layer.tar" '["/bin/cat","/hello.txt"]'
    rm -rf "$d"
}

# mkoci_layer <out.tar> <name> <layer.tar> <Cmd JSON array> [<Env JSON array>]: an OCI image
# layout tarball with that one uncompressed layer, for this machine's architecture.
mkoci_layer() {
    local out=$1 name=$2 layer=$3 cmd=$4 env=${5:-} d arch lsha lsize csha csize msha msize
    case "$(uname -m)" in x86_64) arch=amd64;; aarch64) arch=arm64;; *) arch=$(uname -m);; esac
    d=$(mktemp -d); mkdir -p "$d/blobs/sha256"
    lsha=$(sha256sum "$layer" | cut -d' ' -f1); lsize=$(stat -c %s "$layer")
    cp "$layer" "$d/blobs/sha256/$lsha"
    printf '{"architecture":"%s","os":"linux","config":{"Cmd":%s%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$arch" "$cmd" "${env:+,\"Env\":$env}" "$lsha" > "$d/config.json"
    csha=$(sha256sum "$d/config.json" | cut -d' ' -f1); csize=$(stat -c %s "$d/config.json")
    mv "$d/config.json" "$d/blobs/sha256/$csha"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$csha" "$csize" "$lsha" "$lsize" > "$d/manifest.json"
    msha=$(sha256sum "$d/manifest.json" | cut -d' ' -f1); msize=$(stat -c %s "$d/manifest.json")
    mv "$d/manifest.json" "$d/blobs/sha256/$msha"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$msha" "$msize" "$arch" "$name" "${name##*:}" > "$d/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' > "$d/oci-layout"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d" -cf "$out" oci-layout index.json blobs
    rm -rf "$d"
}

# mkcorrupt <out.tar>: the first 3 KiB of a valid image tarball followed by garbage: a tarball
# that a careless importer might half-read, and that ctr must reject.
mkcorrupt() {
    local out=$1 t
    t=$(mktemp)
    mkoci "$t" docker.io/library/e2e-corrupt:1 corrupt
    { head -c 3072 "$t"; head -c 4096 /dev/zero | tr '\0' 'x'; } > "$out"
    rm -f "$t"
}
