#!/bin/sh
# Install INCCL for C programs: libinccl.so, libinccl.a, inccl.h and inccl.pc.
#
#   inccl/install.sh [--prefix DIR] [--release|--debug] [--features verbs]
#                    [--no-build] [--lib-dir DIR] [--destdir DIR]
#
# Defaults: --prefix /usr/local, --release, build with cargo first. --lib-dir takes
# the libraries from DIR instead of the cargo target directory (used by the tests).
# Then a C program links with
#   cc prog.c $(pkg-config --cflags --libs inccl)              # shared library
#   cc prog.c $(pkg-config --cflags inccl) "$(pkg-config --variable=libdir inccl)/libinccl.a" \
#      $(pkg-config --static --libs inccl | sed 's/-L[^ ]*//; s/-linccl//')   # static library
# (set PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig for a non-standard prefix).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
prefix=/usr/local
profile=release
features=""
build=1
libdir_src=""
destdir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --release) profile=release; shift ;;
        --debug) profile=debug; shift ;;
        --features) features=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        --lib-dir) libdir_src=$2; shift 2 ;;
        --destdir) destdir=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ "$build" = 1 ]; then
    flag=""
    [ "$profile" = release ] && flag=--release
    # shellcheck disable=SC2086
    cargo build $flag -p inccl ${features:+--features "$features"} --manifest-path "$here/../Cargo.toml"
fi
if [ -z "$libdir_src" ]; then
    target=${CARGO_TARGET_DIR:-$here/../target}
    libdir_src=$target/$profile
fi
for f in libinccl.so libinccl.a; do
    [ -f "$libdir_src/$f" ] || { echo "install.sh: $libdir_src/$f not found (build first or pass --lib-dir)" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/../Cargo.toml" | head -n1)
root=$destdir$prefix
mkdir -p "$root/lib/pkgconfig" "$root/include"
install -m 0755 "$libdir_src/libinccl.so" "$root/lib/libinccl.so"
install -m 0644 "$libdir_src/libinccl.a" "$root/lib/libinccl.a"
install -m 0644 "$here/include/inccl.h" "$root/include/inccl.h"

# System libraries the Rust static library needs (rustc --print native-static-libs).
private="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
# A library built with the verbs feature (asked for here, or unified in by another
# crate of the workspace build) references libibverbs.
if nm -u "$libdir_src/libinccl.a" 2>/dev/null | grep -q ' ibv_'; then
    private="-libverbs $private"
fi
cat > "$root/lib/pkgconfig/inccl.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: inccl
Description: INCCL, the in-network collective library of the INC emulator
Version: $version
Libs: -L\${libdir} -linccl
Libs.private: $private
Cflags: -I\${includedir}
PC
echo "installed inccl $version to $root (pkg-config file $root/lib/pkgconfig/inccl.pc)"
