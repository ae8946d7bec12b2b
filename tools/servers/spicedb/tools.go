//go:build tools

// Package tools pins the SpiceDB command.
package tools

import _ "github.com/authzed/spicedb/cmd/spicedb"
