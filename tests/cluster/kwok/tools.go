//go:build tools

// Package tools pins kwok (sigs.k8s.io/kwok), the kubelet simulator that makes the
// fake test nodes post heartbeats and moves pods bound to them to Running/Ready.
// It is its own module so that kwok builds with the k8s.io versions kwok pins,
// not the ones the control plane in ../go.mod uses.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
