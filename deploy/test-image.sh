#!/usr/bin/env bash
# Build the Docker image without a Docker engine and check that it works (.ci/run calls this):
#   1. a Debian base made with debootstrap (cached), with this machine's CA bundle, so that pip
#      inside the build trusts this network's TLS;
#   2. the top-level Dockerfile built by buildah against it;
#   3. the image's own ENTRYPOINT + CMD run by buildah, its own HEALTHCHECK run until it passes,
#      MCP listed from outside with the host token, a simulated device connected and called,
#      and `esp-mcp-gateway doctor` run inside the image against the running gateway.
# For another architecture (IMAGE_ARCH=arm64: a Raspberry Pi 4/5), steps 1 and 2 are the same,
# run under qemu's user-mode emulation (binfmt_misc), and step 3 is `esp-mcp-gateway --version`
# in the image: the interpreter, the venv and every dependency load on that architecture.
#
# Usage, as root:  deploy/test-image.sh             (this machine's architecture)
#                  IMAGE_ARCH=arm64 deploy/test-image.sh
# Needs: apt-get install buildah podman debootstrap (python3-venv: .venv is made if absent);
#        for a foreign IMAGE_ARCH also qemu-user-static binfmt-support (binfmt_misc mounted).
# Environment: IMAGE_CACHE  where the base rootfs is kept (default /var/tmp/esp-mcp-gateway-image)
#              DEBIAN_MIRROR  the mirror for debootstrap (default: the one apt here uses)
#              IMAGE_ARCH  the image's Debian architecture (default: this machine's)
# Every step is bounded in time; any failure exits 1 with one line saying what failed, after
# printing the logs that explain it. Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly SUITE=bookworm
readonly PACKAGES=python3,python3-venv,python3-pip,ca-certificates
readonly CACHE=${IMAGE_CACHE:-/var/tmp/esp-mcp-gateway-image}
NATIVE=$(dpkg --print-architecture)
readonly NATIVE
readonly ARCH=${IMAGE_ARCH:-$NATIVE}
if [[ $ARCH == "$NATIVE" ]]; then
    readonly IMAGE=localhost/esp-mcp-gateway:test
else
    readonly IMAGE=localhost/esp-mcp-gateway:test-$ARCH
fi
readonly CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
readonly PY=.venv/bin/python
readonly STARTED=$SECONDS

work=$(mktemp -d /tmp/esp-mcp-gateway-image.XXXXXX)
container=""
server_pid=""
simulator_pid=""

say() { printf '[%3ds] %s\n' "$((SECONDS - STARTED))" "$*"; }
fail() {
    printf 'test-image: FAILED: %s\n' "$*" >&2
    exit 1
}
show() { # show LOG [LINES]: the tail of a log, when there is one, to explain a failure
    if [[ -s $1 ]]; then
        printf -- '--- %s (last %s lines)\n' "${1##*/}" "${2:-40}" >&2
        tail -n "${2:-40}" "$1" >&2
    fi
}

# The process tree under PID (buildah run forks its runtime, which forks the command).
descendants() {
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
        echo "$child"
        descendants "$child"
    done
}

# Stop a process started here and everything it started. The command itself (the leaf) gets
# SIGTERM first, as Docker would send it, so the gateway shuts down cleanly and buildah exits
# after it; whatever is left after 10 s gets SIGKILL. By pid only, never by name: other builds
# and gateways may run on this machine.
stop() {
    local pid=$1 children leaves="" child waited=0
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    children=$(descendants "$pid" | tr '\n' ' ')
    for child in $children; do
        [[ -n $(ps -o pid= --ppid "$child" 2>/dev/null) ]] || leaves+=" $child"
    done
    # shellcheck disable=SC2086  # one pid per word
    kill -TERM ${leaves:-$pid} 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && ((waited < 20)); do
        sleep 0.5
        waited=$((waited + 1))
    done
    # shellcheck disable=SC2086
    kill -KILL "$pid" $children 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    stop "$simulator_pid"
    stop "$server_pid"
    if [[ -n $container ]]; then
        buildah rm "$container" >/dev/null 2>&1 || true
    fi
    if ((status != 0)); then
        show "$work/server.log" 60
        show "$work/simulator.log" 20
    fi
    rm -rf "$work"
    say "done (exit $status)"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- preconditions ------------------------------------------------------------------------------

[[ $(id -u) == 0 ]] || fail "run as root (buildah and debootstrap need it)"
for tool in buildah podman debootstrap python3 ps; do
    command -v "$tool" >/dev/null \
        || fail "$tool is missing: apt-get install buildah podman debootstrap python3-venv procps"
done
if [[ $ARCH != "$NATIVE" ]]; then # emulation: the kernel hands $ARCH binaries to qemu
    qemu=$(case $ARCH in arm64) echo aarch64 ;; armhf) echo arm ;; *) echo "$ARCH" ;; esac)
    [[ -e /proc/sys/fs/binfmt_misc/status ]] \
        || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
        || fail "binfmt_misc is not mounted and cannot be (this kernel cannot run $ARCH binaries)"
    if ! grep -qs enabled "/proc/sys/fs/binfmt_misc/qemu-$qemu"; then # installed before the mount
        update-binfmts --enable "qemu-$qemu" >/dev/null 2>&1 || true
    fi
    grep -qs enabled "/proc/sys/fs/binfmt_misc/qemu-$qemu" \
        || fail "no qemu-$qemu in binfmt_misc: apt-get install qemu-user-static binfmt-support"
fi
if [[ ! -x $PY ]]; then # the host side (MCP client, simulator) runs from the project's venv
    say "host: making .venv"
    timeout 600 python3 -m venv .venv
    timeout 600 .venv/bin/python -m pip install --quiet --disable-pip-version-check -e . \
        || fail "could not install the project into .venv"
fi

# --- 1. the base image: debootstrap, cached ------------------------------------------------------

# The Debian mirror apt already uses here (reachable by definition), else deb.debian.org.
mirror() {
    if [[ -n ${DEBIAN_MIRROR:-} ]]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local uri
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | sed 's/#.*//' | grep -oE '(https?|file)://[^ ]*/debian/?( |$)' \
        | grep -v security | head -n 1 | tr -d ' ' || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

key=$(printf '%s %s' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
rootfs=$CACHE/$SUITE-minbase-$ARCH-$key.tar
if [[ -s $rootfs ]]; then
    say "base: cached rootfs $rootfs"
else
    mkdir -p "$CACHE"
    partial=$CACHE/rootfs.partial.$$
    rm -rf "$partial"
    say "base: debootstrap $SUITE ($ARCH) from $(mirror) (a minute; several under emulation)"
    if ! timeout 1200 debootstrap --arch="$ARCH" --variant=minbase --include="$PACKAGES" \
        "$SUITE" "$partial" \
        "$(mirror)" >"$work/debootstrap.log" 2>&1; then
        show "$work/debootstrap.log"
        rm -rf "$partial"
        fail "debootstrap could not make the base (set DEBIAN_MIRROR to a reachable mirror?)"
    fi
    # apt's package cache and lists are dead weight in an image.
    rm -rf "$partial"/var/cache/apt/archives/*.deb "$partial"/var/lib/apt/lists/*
    tar -C "$partial" -cf "$rootfs.partial.$$" .
    mv "$rootfs.partial.$$" "$rootfs" # atomic: a run killed midway leaves no half tarball
    rm -rf "$partial"
fi

# The base image is tagged by the rootfs and this machine's CA bundle: a new bundle, a new base.
certs=$(sha256sum "$CA_BUNDLE" | cut -c1-12)
base=localhost/esp-mcp-gateway-base:$SUITE-$ARCH-$key-$certs
if buildah inspect --type image "$base" >/dev/null 2>&1; then
    say "base: $base (already imported)"
else
    say "base: importing as $base"
    raw=localhost/esp-mcp-gateway-base:raw-$$
    timeout 300 podman import --quiet --arch "$ARCH" "$rootfs" "$raw" >/dev/null
    ctr=$(buildah from --quiet --arch "$ARCH" "$raw")
    # pip in the build must trust whatever TLS this network presents: the host's bundle has it.
    # Only the cert is needed: PyPI itself is reachable; the host's extra local indexes are not.
    printf '[global]\ncert = %s\n' "$CA_BUNDLE" >"$work/pip.conf"
    if [[ ${PIP_INDEX_URL:-} == http* ]]; then
        printf 'index-url = %s\n' "$PIP_INDEX_URL" >>"$work/pip.conf"
    fi
    buildah copy --quiet "$ctr" "$CA_BUNDLE" "$CA_BUNDLE" >/dev/null
    buildah copy --quiet "$ctr" "$work/pip.conf" /etc/pip.conf >/dev/null
    buildah commit --quiet "$ctr" "$base" >/dev/null
    buildah rm "$ctr" >/dev/null
    buildah rmi "$raw" >/dev/null
fi

# --- 2. the image ---------------------------------------------------------------------------------

say "build: buildah bud Dockerfile ($ARCH, BASE_IMAGE=$base)"
previous=$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE" 2>/dev/null || true)
# --format docker: OCI image configs have no HEALTHCHECK. --layers: reuse unchanged steps.
if ! timeout 1800 buildah bud --isolation chroot --layers --format docker --arch "$ARCH" \
    --build-arg "BASE_IMAGE=$base" --tag "$IMAGE" --file Dockerfile . >"$work/build.log" 2>&1; then
    show "$work/build.log" 60
    fail "buildah could not build the Dockerfile"
fi
current=$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE")
if [[ -n $previous && $previous != "$current" ]]; then
    buildah rmi "$previous" >/dev/null 2>&1 || true # our last test image, not the layer cache
fi
say "build: $IMAGE $(buildah images --format '{{.Size}}' "$IMAGE" | head -n 1)"
built_arch=$(buildah inspect --type image --format '{{.OCIv1.Architecture}}' "$IMAGE")
[[ $built_arch == "$ARCH" ]] || fail "the image is for $built_arch, not $ARCH"

# What the image says about itself, checked, and its entrypoint and health check as argv lists.
buildah inspect --type image "$IMAGE" >"$work/image.json"
"$PY" - "$work/image.json" "$work" <<'EOF' || fail "the image's configuration is wrong"
import json, sys
config = json.load(open(sys.argv[1]))["Docker"]["config"]
env = dict(item.split("=", 1) for item in config.get("Env") or [])
problems = []
if (config.get("User") or "root").split(":")[0] in ("", "root", "0"):
    problems.append(f"runs as root (User={config.get('User')!r})")
for port in ("8765/tcp", "8766/tcp", "1883/tcp"):
    if port not in (config.get("ExposedPorts") or {}):
        problems.append(f"does not expose {port}")
if "/data" not in (config.get("Volumes") or {}):
    problems.append("has no /data volume")
expected = {"GATEWAY_DATA_DIR": "/data", "GATEWAY_DEVICE_LISTEN": "0.0.0.0:8765",
            "GATEWAY_HOST_LISTEN": "0.0.0.0:8766"}
problems += [f"{k}={env.get(k)!r}, not {v!r}" for k, v in expected.items() if env.get(k) != v]
test = (config.get("Healthcheck") or {}).get("Test") or []
if not test or test[0] not in ("CMD", "CMD-SHELL"):
    problems.append(f"has no HEALTHCHECK ({test})")
for problem in problems:
    print(f"the image {problem}", file=sys.stderr)
entry = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
health = test[1:] if test[:1] == ["CMD"] else ["/bin/sh", "-c", *test[1:]]
for name, argv in (("entrypoint", entry), ("healthcheck", health)):
    with open(f"{sys.argv[2]}/{name}", "w") as out:
        out.write("".join(arg + "\0" for arg in argv))
sys.exit(1 if problems else 0)
EOF
mapfile -d '' -t entrypoint <"$work/entrypoint"
mapfile -d '' -t healthcheck <"$work/healthcheck"
say "image: runs ${entrypoint[*]}; health check: ${healthcheck[*]}"

if [[ $ARCH != "$NATIVE" ]]; then # under emulation: the program starts and knows its version
    container=$(buildah from --quiet --arch "$ARCH" --name "esp-mcp-gateway-test-$$" "$IMAGE")
    expected=$("$PY" -c 'import gateway; print(gateway.__version__)')
    began=$SECONDS
    version=$(timeout 300 buildah run --isolation chroot "$container" -- \
        "${entrypoint[0]}" --version 2>"$work/version.log" </dev/null) \
        || { show "$work/version.log"; fail "esp-mcp-gateway --version failed on $ARCH"; }
    machine=$(timeout 120 buildah run --isolation chroot "$container" -- \
        /opt/esp-mcp-gateway/bin/python -c 'import platform; print(platform.machine())' </dev/null)
    [[ $version == *"$expected"* ]] || fail "--version on $ARCH says '$version', not $expected"
    say "run: '${entrypoint[0]} --version' on $machine (emulated): $version, $((SECONDS - began)) s"
    say "all checks passed"
    exit 0
fi

# --- 3. run it ------------------------------------------------------------------------------------

# Chroot isolation shares this machine's network namespace: the listeners bind here, so use
# ports that are free here (8765 and friends may be taken by other work on this machine).
read -r device_port host_port mqtt_port < <(
    python3 -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("0.0.0.0", 0))
print(*(s.getsockname()[1] for s in socks))'
)
host_token=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
device_token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
ports=(
    --env "GATEWAY_DEVICE_LISTEN=0.0.0.0:$device_port"
    --env "GATEWAY_HOST_LISTEN=0.0.0.0:$host_port"
    --env "GATEWAY_MQTT_LISTEN=0.0.0.0:$mqtt_port"
)
env=("${ports[@]}"
    --env "GATEWAY_HOST_TOKEN=$host_token" --env "GATEWAY_DEVICE_TOKEN=$device_token")
container=$(buildah from --quiet --name "esp-mcp-gateway-test-$$" "$IMAGE")
run=(buildah run --isolation chroot) # a command, not a function: timeout runs it

# Off loopback without a host token, the entrypoint must refuse, saying what to set.
if timeout 60 "${run[@]}" "${ports[@]}" "$container" -- "${entrypoint[@]}" \
    >"$work/no-token.log" 2>&1 </dev/null; then
    fail "the entrypoint started without GATEWAY_HOST_TOKEN"
fi
grep -q "set GATEWAY_HOST_TOKEN" "$work/no-token.log" \
    || { show "$work/no-token.log"; fail "no clear message when GATEWAY_HOST_TOKEN is missing"; }
refusal=$(grep -o 'configuration error.*' "$work/no-token.log" | head -n 1 | cut -c1-80)
say "run: without GATEWAY_HOST_TOKEN it refuses: $refusal..."

say "run: ${entrypoint[*]} (device :$device_port, host :$host_port, mqtt :$mqtt_port)"
setsid "${run[@]}" "${env[@]}" "$container" -- "${entrypoint[@]}" \
    >"$work/server.log" 2>&1 </dev/null &
server_pid=$!

# The image's own HEALTHCHECK command, in the container, with the server's environment.
deadline=$((SECONDS + 90))
until timeout 20 "${run[@]}" "${env[@]}" "$container" -- "${healthcheck[@]}" \
    >"$work/health.log" 2>&1 </dev/null; do
    kill -0 "$server_pid" 2>/dev/null || fail "the gateway exited before it was healthy"
    if ((SECONDS >= deadline)); then
        show "$work/health.log"
        fail "the health check did not pass within 90 s"
    fi
    sleep 1
done
say "health: the image's HEALTHCHECK passes"

mcp_url=http://127.0.0.1:$host_port/mcp
timeout 90 "$PY" deploy/smoke_client.py tools "$mcp_url" "$host_token" \
    || fail "MCP from outside the container"

setsid .venv/bin/esp-mcp-gateway simulate --url "ws://127.0.0.1:$device_port/xiaozhi/v1/" \
    --token "$device_token" >"$work/simulator.log" 2>&1 </dev/null &
simulator_pid=$!
timeout 90 "$PY" deploy/smoke_client.py device "$mcp_url" "$host_token" \
    || fail "a simulated device through the gateway in the container"
timeout 90 "$PY" deploy/smoke_client.py relay "$mcp_url" "$host_token" \
    || fail "Claude Desktop's entry (deploy/claude_desktop_config.example.json) through the relay"

# doctor in the image, next to the running gateway, as a user would run it (docker compose exec).
doctor=0
timeout 60 "${run[@]}" "${env[@]}" --env "GATEWAY_DEVICE_URL=http://192.0.2.10:$device_port" \
    "$container" -- esp-mcp-gateway doctor >"$work/doctor.log" 2>&1 </dev/null || doctor=$?
sed 's/^/    /' "$work/doctor.log"
((doctor == 0)) || fail "esp-mcp-gateway doctor found problems in the running image (exit $doctor)"
say "doctor: no problems in the running image"

kill -0 "$server_pid" 2>/dev/null || fail "the gateway died during the checks"
stop "$simulator_pid"
simulator_pid=""
sleep 1 # the gateway logs the device's departure asynchronously: let it land before counting
if grep -q Traceback "$work/server.log"; then # reported, not failed: not what this script tests
    say "WARNING: the gateway logged $(grep -c Traceback "$work/server.log") traceback(s) serving:"
    grep -m 1 -B 1 -A 3 Traceback "$work/server.log" | sed 's/^/    /'
    grep -A 200 Traceback "$work/server.log" \
        | grep -m 1 -E '^[a-zA-Z_.]+(Error|Exception|Disconnect)' | sed 's/^/    .../'
fi
served=$(wc -l <"$work/server.log")

# SIGTERM, as `docker stop` sends it: the gateway must stop by itself, promptly and cleanly.
stopped=$SECONDS
stop "$server_pid"
server_pid=""
((SECONDS - stopped < 10)) || fail "the gateway did not stop within 10 s of SIGTERM"
if tail -n "+$((served + 1))" "$work/server.log" | grep -q Traceback; then
    fail "the gateway logged a traceback while stopping"
fi
say "stop: the gateway stopped cleanly on SIGTERM in $((SECONDS - stopped)) s"

# --- 4. the Home Assistant add-on: this image plus run.py ----------------------------------------

addon=localhost/esp-mcp-gateway-addon:test
say "add-on: buildah bud home-assistant/esp_mcp_gateway (BUILD_FROM=$IMAGE)"
if ! timeout 300 buildah bud --isolation chroot --layers --format docker \
    --build-arg "BUILD_FROM=$IMAGE" --tag "$addon" home-assistant/esp_mcp_gateway \
    >"$work/addon-build.log" 2>&1; then
    show "$work/addon-build.log"
    fail "buildah could not build the add-on"
fi
# /data as Home Assistant mounts it: root's, holding the options the user set. (Copied in:
# buildah run puts an image VOLUME over any bind mount of the same path.)
printf '{"host_token": "%s", "mqtt_mode": "off", "log_level": "info"}\n' "$host_token" \
    >"$work/options.json"
buildah rm "$container" >/dev/null
container=$(buildah from --quiet --name "esp-mcp-gateway-addon-test-$$" "$addon")
buildah copy --quiet "$container" "$work/options.json" /data/options.json >/dev/null
timeout 60 "${run[@]}" "$container" -- chown -R 0:0 /data </dev/null
say "add-on: run.py with options.json (device :$device_port, host :$host_port)"
setsid "${run[@]}" "${ports[@]}" "$container" -- \
    /opt/esp-mcp-gateway/bin/python /opt/esp-mcp-gateway/ha-run.py \
    >"$work/server.log" 2>&1 </dev/null &
server_pid=$!
"$PY" - "$host_port" "$host_token" <<'EOF_PY' || fail "the add-on's gateway did not answer"
import sys, time, urllib.request
port, token = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 60
while True:  # /healthz with the host token: the gateway runs with the add-on's options
    request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:
            if "devices" in answer.read().decode():
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.2)
EOF_PY
grep -q "MCP hosts connect to" "$work/server.log" || fail "the add-on does not say its MCP URL"
stop "$server_pid"
server_pid=""
# Made by the gateway after run.py dropped root: its owner is the process's user.
owner=$(timeout 60 "${run[@]}" "$container" -- stat -c %u:%U /data /data/registry.sqlite3 \
    </dev/null | sort -u | tr '\n' ' ')
[[ $owner == "10001:gateway " ]] || fail "the add-on's /data belongs to $owner, not gateway (10001)"
say "add-on: serves with the options' host token, as uid 10001 on /data; says its MCP URL"
say "all checks passed"
