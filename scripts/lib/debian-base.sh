# The Debian base image of docker/build-images and scripts/pristine-check (sourced, not
# executed): a minbase root file system made by mmdebstrap and loaded with `docker
# import`, tagged with a hash of its recipe, so it is built once per machine.

# debian_base_image REPO SUITE MIRROR PACKAGE...: prints REPO:HASH on standard output,
# building the image first if the engine does not have it; progress goes to stderr.
debian_base_image() {
    local repo=$1 suite=$2 mirror=$3
    shift 3
    local packages tag work start
    packages="$(printf '%s\n' "$@" | sed '/^$/d' | sort -u)"
    # The recipe version changes when the mmdebstrap call below changes meaning.
    tag="$repo:$(printf 'recipe 1\n%s\n%s\n%s\n' "$suite" "$mirror" "$packages" | sha256sum | cut -c1-16)"
    if docker image inspect "$tag" >/dev/null 2>&1; then
        echo "[base-image] $tag (cached)" >&2
        echo "$tag"
        return 0
    fi
    # scripts/setup owns the package list (its `docker` group has mmdebstrap).
    "$(dirname "${BASH_SOURCE[0]}")/../setup" --ensure docker >&2 || return 1
    echo "[base-image] building $tag: Debian $suite from $mirror with $(echo "$packages" | wc -l) packages" >&2
    start=$SECONDS
    work="$(mktemp -d /tmp/inc-base-image.XXXXXX)"
    # Documentation, man pages and locales are left out: the images only run programs.
    if ! mmdebstrap --variant=minbase --include="$(echo "$packages" | paste -sd,)" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$suite" "$work/rootfs.tar" "$mirror" >"$work/mmdebstrap.log" 2>&1; then
        tail -n 30 "$work/mmdebstrap.log" >&2
        echo "[base-image] mmdebstrap failed (log above)" >&2
        rm -rf "$work"
        return 1
    fi
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        "$work/rootfs.tar" "$tag" >/dev/null || { rm -rf "$work"; return 1; }
    rm -rf "$work"
    echo "[base-image] $tag built in $((SECONDS - start))s" >&2
    echo "$tag"
}
