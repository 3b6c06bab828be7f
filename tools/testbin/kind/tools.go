//go:build tools

// Package tools pins kind, which runs the e2e cluster (make e2e) in the harness's Docker engine.
package tools

import (
	_ "sigs.k8s.io/kind"
)
