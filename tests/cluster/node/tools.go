//go:build tools

// Package tools pins what a real test node runs besides the kubelet (which is built
// from the control plane's module, ../go.mod): containerd 2 with its runc shim and
// ctr, and the CNI plugins the node's pod network uses (bridge, host-local,
// loopback). runc comes from the distribution (it needs libseccomp, C).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
