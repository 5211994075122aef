# Shared by the control-plane scripts in this folder. Source it; do not run it.
# shellcheck shell=bash

CLUSTER_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The one Kubernetes version the suite runs against; it must match go.mod.
K8S_VERSION="v1.37.2"
BERTH_CACHE="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"
K8S_BIN="$BERTH_CACHE/k8s-$K8S_VERSION/bin"

die() {
	echo "error: $*" >&2
	exit 1
}

log() {
	echo "[$(date +%H:%M:%S)] $*" >&2
}

# require_dir DIR: the cluster state folder given on the command line.
require_dir() {
	[ -n "${1:-}" ] || die "usage: $(basename "$0") DIR"
}

# free_ports N: N distinct TCP ports on 127.0.0.1 that nothing listens on right now.
# All sockets stay open until every port is chosen, so no port is handed out twice.
free_ports() {
	python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# kubectl_for DIR ARGS...: our own kubectl, pointed only at the cluster in DIR.
kubectl_for() {
	local dir="$1"
	shift
	"$K8S_BIN/kubectl" --kubeconfig "$dir/kubeconfig" "$@"
}
