#!/bin/sh
# Make a container engine usable on this machine: podman (through the Docker CLI
# verbs the farm uses), its runtime, debootstrap for local base images and
# qemu-user-static for emulated aarch64. Idempotent: a second run changes nothing
# and ends with the `podman info` check. Needs root (apt-get); prints one line
# and exits 1 when it cannot.
set -eu

log() { echo "setup-engine: $*"; }

if [ "$(id -u)" != 0 ]; then
    if command -v podman >/dev/null 2>&1 && podman info >/dev/null 2>&1; then
        log "not root; podman already answers info, nothing to do"; exit 0
    fi
    log "not root: cannot apt-get install podman (install podman runc uidmap fuse-overlayfs slirp4netns by hand)"
    exit 1
fi

PKGS="podman runc uidmap fuse-overlayfs slirp4netns debootstrap qemu-user-static binfmt-support"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    log "installing:$missing"
    export DEBIAN_FRONTEND=noninteractive
    # Another process may hold the dpkg lock briefly (a helper installing too): wait for it.
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    # shellcheck disable=SC2086
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $missing >/dev/null
fi

# Debian's podman defaults to crun, which is not installed with --no-install-recommends;
# runc works here. The nofile/nproc limits keep builds with many compiler processes happy
# when the sandbox's own limits are lower than podman's defaults expect.
CONF=/etc/containers/containers.conf
WANT='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"'
mkdir -p /etc/containers
if [ ! -f "$CONF" ] || ! grep -q '^runtime = "runc"' "$CONF" || ! grep -q 'nofile=20000:20000' "$CONF"; then
    if [ -f "$CONF" ] && [ ! -f "$CONF.farm-orig" ]; then cp "$CONF" "$CONF.farm-orig"; fi
    printf '%s\n' "$WANT" > "$CONF.tmp" && mv "$CONF.tmp" "$CONF"
    log "wrote $CONF (runtime runc, default ulimits)"
fi

# No registry is reachable: podman must never try one for an unqualified name
# (the farm always names local images fully, localhost/...).
if ! out=$(podman info --format '{{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}}' 2>&1); then
    log "podman info failed: $(printf '%s' "$out" | tail -n 1)"
    exit 1
fi
log "podman answers info (runtime/storage: $out)"
