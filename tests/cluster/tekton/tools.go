//go:build tools

// Package tools pins the Tekton Pipelines controller (github.com/tektoncd/pipeline),
// which the e2e tier runs against berth's test control plane: Tekton creates the
// task pods and the affinity-assistant pods that berth must route. Only the
// controller is built; Tekton's own webhook (defaulting, validation, conversion)
// is not needed for v1 objects, since the controller applies its defaults when it
// reconciles. It is its own module so that Tekton builds with the k8s.io versions
// it pins, not the control plane's.
package tools

import (
	_ "github.com/tektoncd/pipeline/cmd/controller"
)
