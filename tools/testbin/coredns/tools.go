//go:build tools

// Package tools pins CoreDNS, the cluster DNS of the e2e kind node (its image is built here).
package tools

import (
	_ "github.com/coredns/coredns"
)
