# shellcheck shell=bash
# mkoci <out.tar> <image name> <text>: write a minimal, valid OCI image layout tarball (one
# uncompressed layer holding /hello.txt) that `ctr -n k8s.io images import` accepts. Built with
# coreutils + tar only, on the outer machine, so no registry is needed.
mkoci() {
    local out=$1 name=$2 text=$3 d arch
    d=$(mktemp -d)
    case "$(uname -m)" in x86_64) arch=amd64;; aarch64) arch=arm64;; *) arch=$(uname -m);; esac
    mkdir -p "$d/rootfs" "$d/oci/blobs/sha256"
    printf '%s\n' "$text" > "$d/rootfs/hello.txt"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d/rootfs" -cf "$d/layer.tar" hello.txt
    local lsha lsize csha csize msha msize
    lsha=$(sha256sum "$d/layer.tar" | cut -d' ' -f1); lsize=$(stat -c %s "$d/layer.tar")
    cp "$d/layer.tar" "$d/oci/blobs/sha256/$lsha"
    printf '{"architecture":"%s","os":"linux","config":{"Cmd":["/bin/cat","/hello.txt"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$arch" "$lsha" > "$d/config.json"
    csha=$(sha256sum "$d/config.json" | cut -d' ' -f1); csize=$(stat -c %s "$d/config.json")
    cp "$d/config.json" "$d/oci/blobs/sha256/$csha"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$csha" "$csize" "$lsha" "$lsize" > "$d/manifest.json"
    msha=$(sha256sum "$d/manifest.json" | cut -d' ' -f1); msize=$(stat -c %s "$d/manifest.json")
    cp "$d/manifest.json" "$d/oci/blobs/sha256/$msha"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$msha" "$msize" "$arch" "$name" "${name##*:}" > "$d/oci/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' > "$d/oci/oci-layout"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d/oci" -cf "$out" oci-layout index.json blobs
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
