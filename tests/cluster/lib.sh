# Shared by the control-plane scripts in this folder. Source it; do not run it.
# shellcheck shell=bash

CLUSTER_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The one Kubernetes version the suite runs against; it must match go.mod.
K8S_VERSION="v1.37.2"
BERTH_CACHE="${BERTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}"
K8S_BIN="$BERTH_CACHE/k8s-$K8S_VERSION/bin"
# kwok plays the kubelet for the fake nodes; it must match kwok/go.mod.
KWOK_VERSION="v0.8.0"
KWOK_BIN="$BERTH_CACHE/kwok-$KWOK_VERSION/bin"
# helm lints the chart in charts/berth and installs it in tests; it must match helm/go.mod.
HELM_VERSION="v4.3.1"
HELM_BIN="$BERTH_CACHE/helm-$HELM_VERSION/bin"
# The Tekton Pipelines controller the e2e tier runs; it must match tekton/go.mod.
TEKTON_VERSION="v1.15.0"
TEKTON_HOME="$BERTH_CACHE/tekton-$TEKTON_VERSION"

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

# established DIR SECONDS ARGS...: waits until the CRDs that ARGS name (as kubectl
# names them: crd/NAME, or -f FILES) are Established. `kubectl wait` has been seen
# to give up at once rather than wait (a loaded machine, a CRD whose status the
# apiserver had not written yet), so it is asked again until SECONDS have passed;
# its last answer is printed when they have.
established() {
	local dir="$1" seconds="$2"
	shift 2
	local deadline=$((SECONDS + seconds)) out
	until out="$(kubectl_for "$dir" wait --for=condition=Established --timeout=5s "$@" 2>&1)"; do
		if [ $SECONDS -ge $deadline ]; then
			echo "$out" >&2
			return 1
		fi
		sleep 0.5
	done
}

# record_command DIR NAME [VAR=VALUE...] EXECUTABLE ARGS...: keep how to start a
# component in DIR/commands/NAME (its executable, then its command line quoted for
# the shell), so `launch` can start it now and `component DIR start` again later.
# EXECUTABLE is a path, or a name in the control plane's bin folder.
record_command() {
	local dir="$1" name="$2"
	shift 2
	local env=()
	while [[ "$1" == *=* ]]; do
		env+=("$1")
		shift
	done
	local bin="$1"
	shift
	[[ "$bin" == */* ]] || bin="$K8S_BIN/$bin"
	mkdir -p "$dir/commands"
	{
		readlink -f "$bin"
		printf '%q ' env "${env[@]}" "$bin" "$@"
		echo
	} >"$dir/commands/$name"
}

# launch DIR NAME: start a recorded component in its own session, logging to
# DIR/logs/NAME.log (appended: a restart keeps the earlier log), and record
# "NAME PID EXECUTABLE" in DIR/pids.
launch() {
	local dir="$1" name="$2" exe command
	{
		read -r exe
		read -r command
	} <"$dir/commands/$name"
	# setsid, bash and env each exec the next: the pid recorded is the component's,
	# once the last exec is done (until then `stop` would not know it as ours).
	setsid bash -c "exec $command" >>"$dir/logs/$name.log" 2>&1 </dev/null &
	local pid=$! deadline=$((SECONDS + 5))
	until ours "$pid" "$exe" || [ $SECONDS -ge $deadline ] || ! kill -0 "$pid" 2>/dev/null; do
		sleep 0.01
	done
	echo "$name $pid $exe" >>"$dir/pids"
}

# ours PID EXECUTABLE: PID still runs EXECUTABLE (a reused pid is never touched).
ours() { [ "$(readlink "/proc/$1/exe" 2>/dev/null)" = "$2" ]; }

# exiting PID: on its way out: no executable any more, but not yet a zombie (the
# kernel drops /proc/PID/exe early in exit, while a process like etcd may still be
# closing files). Zombies count as stopped: PID 1 here may never reap them.
exiting() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[ "${stat:0:1}" != Z ] && ! readlink "/proc/$1/exe" >/dev/null 2>&1
}

# stop_process NAME PID EXECUTABLE: TERM, then KILL after 10s; returns once the
# process is gone (or still exiting 5s after KILL).
stop_process() {
	local name="$1" pid="$2" exe="$3" deadline killed=
	ours "$pid" "$exe" || return 0
	kill -TERM "$pid" 2>/dev/null || true
	deadline=$((SECONDS + 10))
	while ours "$pid" "$exe" || exiting "$pid"; do
		if [ $SECONDS -ge $deadline ] && [ -z "$killed" ] && ours "$pid" "$exe"; then
			log "$name ($pid) did not stop on TERM within 10s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
			killed=yes
			deadline=$((SECONDS + 5))
		elif [ $SECONDS -ge $deadline ]; then
			log "$name ($pid) is still exiting; going on"
			break
		fi
		sleep 0.1
	done
}

# The real test node (build-node, add-real-node): containerd and the CNI plugins
# built from node/go.mod, the kubelet from this folder's go.mod, pause from the
# Kubernetes module's own source, runc from the distribution. They must match
# node/go.mod.
CONTAINERD_VERSION="v2.4.2"
CNI_PLUGINS_VERSION="v1.10.0"
NODE_BIN="$BERTH_CACHE/node-$K8S_VERSION-containerd-$CONTAINERD_VERSION-cni-$CNI_PLUGINS_VERSION/bin"
# The real node's sandbox image (made by add-real-node from build-node's pause),
# and the label that keeps kwok from managing the real node.
PAUSE_IMAGE="registry.berth.test/pause:$K8S_VERSION"
REAL_NODE_LABEL="berth.io/real-node"
# berth's image on the real node (load-image).
BERTH_IMAGE_REPOSITORY="registry.berth.test/berth"
