//go:build tools

// Package tools pins helm (helm.sh/helm/v4), which `make lint` and tests/chart.rs
// use to lint, render and install the chart in charts/berth. It is its own module
// so that helm builds with the k8s.io versions helm pins, not the ones the control
// plane in ../go.mod uses, and so that `go mod tidy` keeps go.sum complete.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
