//go:build tools

// Package tools pins the Pushgateway command (a test server: tests/metrics.rs pushes to it and
// scrapes it).
package tools

import _ "github.com/prometheus/pushgateway"
