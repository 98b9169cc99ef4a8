# Shared by scripts/run and scripts/test: install what is missing, nothing more.
# Sourced, not executed.

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "error: need root (or sudo) to run: $*" >&2
        exit 1
    fi
}

# ensure_debian_packages PKG...: apt-get installs the packages that are not installed yet.
ensure_debian_packages() {
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing Debian packages: ${missing[*]}" >&2
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# swift_build ARGS...: `swift build ARGS...`, one build of this package at a time on this machine (under
# flock on $RELAY_BUILD_LOCK, where flock is installed): two builds at once spoil each other's outputs,
# and scripts/fresh-build removes our modules' outputs under the same lock.
swift_build() {
    if command -v flock >/dev/null; then
        flock "${RELAY_BUILD_LOCK:-/tmp/relay-build.lock}" swift build "$@"
    else
        swift build "$@"
    fi
}

ensure_swift() {
    if ! command -v swift >/dev/null; then
        echo "error: Swift 6.1 or later is needed (https://www.swift.org/install/linux/)" >&2
        exit 1
    fi
}

# The C libraries the relay links: libwebsockets (with OpenSSL for wss://), SQLite (portfolio), and
# libnats (the official NATS C client, for clusters).
ensure_relay_dependencies() {
    ensure_swift
    ensure_debian_packages libwebsockets-dev libssl-dev libsqlite3-dev libnats-dev libzstd-dev pkg-config
}

# The NATS server (with JetStream) that clusters run on; the cluster tests and scripts/cluster start it.
ensure_nats_server() {
    ensure_debian_packages nats-server
}
