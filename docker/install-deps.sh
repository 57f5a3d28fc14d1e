#!/bin/sh
# The ONE place a builder image gets its packages, keyed by package manager:
#   dnf -> production quay.io/pypa/manylinux_2_28_{x86_64,aarch64}, plus NVIDIA's
#          rhel8 CUDA repo packages when CUDA_VERSION is set (facts/cuda_toolkits.yml);
#   apt -> the local Debian bookworm base (debootstrap). Its packages are already
#          in the debootstrapped root (`farm images base` passes `--print apt` to
#          debootstrap --include), so this path needs no network.
# Then it writes /etc/farm-image.json: the image's glibc, its declared manylinux
# tag (manylinux images set AUDITWHEEL_PLAT) and the Pythons it provides.
#
#   install-deps.sh                    install for this image's package manager
#   install-deps.sh --print apt|dnf    print that manager's package list
#   install-deps.sh --dry-run apt|dnf  print the commands it would run (ARCH, CUDA_VERSION from env)
set -eu

# The libraries on the third line let the host's pyenv Pythons (mounted read-only, same
# glibc) import ssl, ctypes, zlib, bz2, lzma, sqlite3 and readline inside the image.
APT_PACKAGES="python3 python3-venv python3-dev python3-pip gcc g++ make patchelf git ca-certificates
 binutils file unzip xz-utils zstd ccache util-linux
 libssl3 libffi8 zlib1g libbz2-1.0 liblzma5 libsqlite3-0 libreadline8 libncursesw6 libuuid1 libexpat1 libnsl2"
DNF_PACKAGES="dnf-plugins-core patchelf git ca-certificates binutils file unzip xz zstd ccache util-linux"
# NVIDIA rhel8 repo package stems; -X-Y is appended from CUDA_VERSION (13.0 -> 13-0).
CUDA_DNF_STEMS="cuda-nvcc cuda-cudart-devel cuda-nvrtc-devel libcublas-devel libcusparse-devel
 libcusolver-devel libcurand-devel cuda-cuobjdump"

dry=""
manager=""
case "${1:-}" in
    --print)
        case "${2:-}" in
            apt) echo $APT_PACKAGES ;;
            dnf) echo $DNF_PACKAGES ;;
            *) echo "install-deps.sh: --print apt|dnf" >&2; exit 2 ;;
        esac
        exit 0 ;;
    --dry-run)
        dry=1; manager="${2:-}"
        case "$manager" in apt|dnf) ;; *) echo "install-deps.sh: --dry-run apt|dnf" >&2; exit 2 ;; esac ;;
    "") ;;
    *) echo "install-deps.sh: unknown argument $1" >&2; exit 2 ;;
esac

run() { if [ -n "$dry" ]; then echo "+ $*"; else "$@"; fi; }

CUDA_VERSION="${CUDA_VERSION:-}"
arch="${ARCH:-$(uname -m)}"
if [ -z "$manager" ]; then
    if command -v dnf >/dev/null 2>&1; then manager=dnf
    elif command -v apt-get >/dev/null 2>&1; then manager=apt
    else echo "install-deps.sh: neither dnf nor apt-get in this image" >&2; exit 1
    fi
fi

if [ "$manager" = dnf ]; then
    run dnf install -y $DNF_PACKAGES
    if [ -n "$CUDA_VERSION" ]; then
        # NVIDIA names its aarch64 server repo "sbsa".
        repo_arch="$arch"; [ "$arch" = aarch64 ] && repo_arch=sbsa
        run dnf config-manager --add-repo \
            "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/${repo_arch}/cuda-rhel8.repo"
        xy="$(echo "$CUDA_VERSION" | cut -d. -f1-2 | tr . -)"
        pkgs=""
        for stem in $CUDA_DNF_STEMS; do pkgs="$pkgs $stem-$xy"; done
        run dnf install -y $pkgs
        run ln -sfn "/usr/local/cuda-$(echo "$xy" | tr - .)" /usr/local/cuda
    fi
    run dnf clean all
else
    missing=""
    for p in $APT_PACKAGES; do
        [ -z "$dry" ] && dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && continue
        missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        # Only when the base lacks something (a base not made by `farm images base`).
        export DEBIAN_FRONTEND=noninteractive
        run apt-get update -qq
        run apt-get install -y -qq --no-install-recommends $missing
    fi
    if [ -n "$CUDA_VERSION" ]; then
        # Debian images take CUDA from NVIDIA's PyPI wheels (the toolkit step), not from apt.
        echo "install-deps.sh: CUDA_VERSION is ignored on apt images (toolkit comes from PyPI wheels)" >&2
    fi
    run apt-get clean
    run rm -rf /var/lib/apt/lists
fi
[ -n "$dry" ] && { echo "+ write /etc/farm-image.json (glibc, AUDITWHEEL_PLAT, Pythons)"; exit 0; }

# --- the host compiler: an older Debian's gcc on its own glibc and libstdc++ --------------
# A local base carries Debian bullseye at /opt/farm-sysroot (farm/runners/images.py). Wrappers
# run its gcc with --sysroot there, so an extension links bullseye's glibc 2.31 and libstdc++ of
# gcc 10 (GLIBCXX_3.4.28), not this image's newer ones; as and ld come from PATH (this image's
# binutils). /usr/include stays reachable after the sysroot's own headers (-idirafter): the
# image's Python headers (Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>)
# and a recipe's system packages. The sysroot's library folders come before every -L a build
# passes: Debian's Python hands setuptools -L/usr/lib/<triplet>, where the image's own libc.so
# would otherwise bind glibc 2.34 symbols. A library only the image has is still found there.
SYSROOT=/opt/farm-sysroot
TOOLCHAIN=/opt/farm-toolchain
toolchain=""
if [ -d "$SYSROOT/usr/lib/gcc" ]; then
    gcc_exe="$(ls "$SYSROOT"/usr/bin/gcc-[0-9]* | sort -V | tail -n 1)"
    major="${gcc_exe##*-}"
    triplet="$("$gcc_exe" -dumpmachine)"
    # The packages' exact versions go into each wrapper: ccache hashes a compiler by its content, and
    # the wrapper is the compiler it sees.
    versions="$(dpkg-query --admindir="$SYSROOT/var/lib/dpkg" -W -f='${Package} ${Version}; ' "gcc-$major" "g++-$major" libc6 "libstdc++-$major-dev")"
    mkdir -p "$TOOLCHAIN/bin" "$TOOLCHAIN/lib"
    driver="$SYSROOT/usr/bin/g++-$major --sysroot=$SYSROOT"
    # The floor shim (docker/libstdcxx-floor.cpp): gcc 9 and 10 members the headers define, instantiated
    # here so that a link binds them locally instead of at GLIBCXX > 3.4.24 (torch's manylinux_2_28).
    shim_src=/usr/local/share/farm/libstdcxx-floor.cpp
    run $driver -std=c++17 -O2 -fPIC -c "$shim_src" -o "$TOOLCHAIN/lib/floor-cxx11.o"
    run $driver -std=c++17 -O2 -fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -c "$shim_src" -o "$TOOLCHAIN/lib/floor-cxx98.o"
    run ar rcs "$TOOLCHAIN/lib/libfarm-floor.a" "$TOOLCHAIN/lib/floor-cxx11.o" "$TOOLCHAIN/lib/floor-cxx98.o"
    rm -f "$TOOLCHAIN/lib/floor-cxx11.o" "$TOOLCHAIN/lib/floor-cxx98.o"
    # Every compile force-includes the libm floor (docker/glibc-floor.h); a preprocess-only run (-E, -M,
    # -MM) does not, since nvcc compiles its -E output again with -c and the header would then be there twice.
    libm_floor='libm_floor="-include /usr/local/share/farm/glibc-floor.h"
for arg; do
    case "$arg" in -E|-M|-MM) libm_floor=""; break ;; esac
done'
    for pair in gcc:gcc cc:gcc g++:g++ c++:g++; do
        # Only the C++ drivers link the shim, and only when they link (-o or -shared, no -c/-S/-E/-M):
        # an archive on a compile-only command line draws a warning, on `g++ -v` alone a link of nothing.
        # The linker takes an archive's members only for what is still undefined where the archive
        # stands, and never what a shared libstdc++ already defined: a build's own -lstdc++ ahead of the
        # shim would win. g++ links libstdc++ after everything anyway, so that one is dropped (the
        # arguments are rotated through "$@"). -nostdlib/-nodefaultlibs links are left as they are.
        floor=""
        if [ "${pair#*:}" = "g++" ]; then
            floor='link=""
for arg; do
    case "$arg" in
        -c|-S|-E|-M|-MM|-fsyntax-only|-nostdlib|-nodefaultlibs|-nostdlib++) link=""; break ;;
        -o*|-shared) link=1 ;;
    esac
done
if [ -n "$link" ]; then
    for arg; do
        shift
        case "$arg" in
            -lstdc++|-l:libstdc++.so*) ;;
            *) set -- "$@" "$arg" ;;
        esac
    done
    set -- "$@" '"$TOOLCHAIN"'/lib/libfarm-floor.a -Wl,--exclude-libs,libfarm-floor.a
fi'
        fi
        cat > "$TOOLCHAIN/bin/${pair%%:*}" <<WRAPPER
#!/bin/sh
# The farm's host compiler (design.md §6.4): gcc $major on the sysroot's glibc and libstdc++.
# $versions
$libm_floor
$floor
exec $SYSROOT/usr/bin/${pair#*:}-$major --sysroot=$SYSROOT -L$SYSROOT/usr/lib/$triplet -L$SYSROOT/usr/lib \\
    -idirafter /usr/include/$triplet -idirafter /usr/include \$libm_floor "\$@"
WRAPPER
        chmod 755 "$TOOLCHAIN/bin/${pair%%:*}"
    done
    sysroot_glibc="$(dpkg-query --admindir="$SYSROOT/var/lib/dpkg" -W -f='${Version}' libc6 | cut -d- -f1)"
    toolchain="\"toolchain\": {\"bin\": \"$TOOLCHAIN/bin\", \"sysroot\": \"$SYSROOT\", \"gcc\": \"$("$gcc_exe" -dumpfullversion)\", \"glibc\": \"$sysroot_glibc\"},
 "
fi

# --- what this image provides -------------------------------------------------------
glibc="$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
pythons=""
if [ -d /opt/python ]; then
    # manylinux: one prefix per CPython, /opt/python/cpXY-cpXY; free-threaded (..t) is never a target.
    for d in /opt/python/cp3*-cp3*; do
        case "$d" in *t) continue ;; esac
        [ -x "$d/bin/python" ] || continue
        v="$("$d/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        pythons="$pythons{\"version\": \"$v\", \"path\": \"$d/bin/python\"},"
    done
else
    v="$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    pythons="{\"version\": \"$v\", \"path\": \"/usr/bin/python3\"},"
fi
cuda_home=""
if [ -x /usr/local/cuda/bin/nvcc ]; then cuda_home=/usr/local/cuda; fi
cat > /etc/farm-image.json <<JSON
{"package_manager": "$manager", "arch": "$arch", "glibc": "$glibc",
 "declared_plat": "${AUDITWHEEL_PLAT:-}", "cuda_home": "$cuda_home",
 ${toolchain}"pythons": [${pythons%,}]}
JSON
cat /etc/farm-image.json
