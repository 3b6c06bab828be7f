//go:build tools

// Package tools pins kube-router, run only as a NetworkPolicy controller (iptables and ipset) in the
// kind e2e cluster, whose pod network zeps_dev.kind wires without one: it enforces the chart's
// NetworkPolicy for ZooKeeper. Its BGP router and service proxy are switched off.
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)
