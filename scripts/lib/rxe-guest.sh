# shellcheck shell=bash
# Soft-RoCE guest images for scripts/rxe-hosts: Debian's kernel (rdma_rxe is a module
# there) unpacked into a cache, not installed; a busybox initramfs with the modules and
# rdma-core; a per-run archive with the host programs, appended to it. Both are
# uncompressed: under TCG, the guest kernel's gunzip costs more boot time than QEMU's
# loading of the larger file.
#
#   rxe_kernel CACHE            -> prints the kernel version; vmlinuz in CACHE/kern/boot
#   rxe_base_initramfs CACHE KV -> CACHE/base-KV-HASH.cpio (built once per version of
#                                  /init and of this file)
#   rxe_run_archive DIR OUT BIN... -> OUT: /inc/<bins>, /inc/run (DIR/run), /inc/host.token
#                                     (DIR/host.token, if there) and their libraries

rxe_log() { echo "[rxe] $*" >&2; }

rxe_kernel() {
    local cache="$1" pkg kv
    pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
    [ -n "$pkg" ] || { rxe_log "apt-cache knows no linux-image-amd64 (run apt-get update)"; return 1; }
    kv="${pkg#linux-image-}"
    if [ ! -e "$cache/kern/boot/vmlinuz-$kv" ]; then
        rxe_log "fetching $pkg (guest kernel, unpacked into $cache, not installed)"
        mkdir -p "$cache/debs"
        (cd "$cache/debs" && apt-get download -q "$pkg" >/dev/null) || return 1
        rm -rf "$cache/kern" && mkdir -p "$cache/kern"
        dpkg-deb -x "$cache/debs/${pkg}"_*.deb "$cache/kern" || return 1
        depmod -b "$cache/kern" "$kv"
    fi
    echo "$kv"
}

# copy the shared libraries FILE links into ROOT at their paths
_rxe_copy_libs() {
    local root="$1" f="$2" l
    for l in $(ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\s*\/lib64/{print $1}'); do
        [ -e "$root$l" ] || { mkdir -p "$root$(dirname "$l")" && cp -L "$l" "$root$l"; }
    done
}

# copy FILE into ROOT at the same path, with its libraries
_rxe_copy_with_libs() {
    mkdir -p "$1$(dirname "$2")" && cp -L "$2" "$1$2" && _rxe_copy_libs "$1" "$2"
}

rxe_base_initramfs() {
    local cache="$1" kv="$2" out r m f a h
    # Keyed by the guest's /init and this builder too, so an edit of either rebuilds it.
    h="$(cat "$(dirname "${BASH_SOURCE[0]}")/rxe-init" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
    out="$cache/base-$kv-$h.cpio"
    [ -s "$out" ] && { echo "$out"; return 0; }
    r="$(mktemp -d "$cache/root.XXXX")"
    mkdir -p "$r"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,usr/bin,usr/sbin,lib64,lib/modules}
    cp /bin/busybox "$r/bin/busybox"
    for a in $("$r/bin/busybox" --list); do [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"; done
    # crc32_generic: rxe computes the ICRC through the crypto API's "crc32"
    for m in virtio_pci virtio_net rdma_rxe ib_uverbs crc32_generic; do
        modprobe -d "$cache/kern" -S "$kv" --show-depends "$m" | awk '$1=="insmod"{print $2}'
    done | sort -u | while read -r f; do
        mkdir -p "$r/$(dirname "${f#"$cache"/kern/}")" && cp "$f" "$r/${f#"$cache"/kern/}"
    done
    cp "$cache/kern/lib/modules/$kv"/modules.{order,builtin,builtin.modinfo} "$r/lib/modules/$kv/" 2>/dev/null || true
    depmod -b "$r" "$kv"
    for f in /usr/bin/rdma /usr/sbin/ip /usr/bin/ibv_devinfo \
        /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so /lib/x86_64-linux-gnu/libgcc_s.so.1; do
        [ -e "$f" ] || { rxe_log "missing $f (run scripts/setup --rxe)"; rm -rf "$r"; return 1; }
        _rxe_copy_with_libs "$r" "$f"
    done
    cp /usr/sbin/ip "$r/usr/bin/ip" && rm -f "$r/bin/ip" && ln -sf /usr/bin/ip "$r/sbin/ip"
    cp /usr/bin/rdma "$r/usr/bin/rdma"
    _rxe_copy_with_libs "$r" /lib64/ld-linux-x86-64.so.2
    mkdir -p "$r/etc/libibverbs.d" && cp /etc/libibverbs.d/rxe.driver "$r/etc/libibverbs.d/"
    echo 'root:x:0:0:root:/root:/bin/sh' >"$r/etc/passwd"
    echo 'root:x:0:' >"$r/etc/group"
    printf '127.0.0.1 localhost\n' >"$r/etc/hosts"
    install -m 755 "$(dirname "${BASH_SOURCE[0]}")/rxe-init" "$r/init"
    (cd "$r" && find . -print0 | cpio --null -o -H newc --quiet) >"$out.tmp" && mv "$out.tmp" "$out"
    rm -rf "$r"
    echo "$out"
}

rxe_run_archive() {
    local dir="$1" out="$2" r b; shift 2
    r="$(mktemp -d "$dir/root.XXXX")"
    mkdir -p "$r/inc"
    for b in "$@"; do
        cp -L "$b" "$r/inc/" && _rxe_copy_libs "$r" "$b"
        # debug info and symbols would make the archive (and the guest's unpacking)
        # many times larger
        strip "$r/inc/$(basename "$b")"
    done
    install -m 755 "$dir/run" "$r/inc/run"
    [ ! -e "$dir/host.token" ] || install -m 600 "$dir/host.token" "$r/inc/host.token"
    (cd "$r" && find . -print0 | cpio --null -o -H newc --quiet) >"$out"
    rm -rf "$r"
}
