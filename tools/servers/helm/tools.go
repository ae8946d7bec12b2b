//go:build tools

// Package tools pins the helm command (a test tool: tests/install.rs renders and lints the chart).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
