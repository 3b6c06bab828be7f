//go:build tools

// Package tools pins nats-server (Apache-2.0), whose JetStream is the baseline the stream and
// replication benchmarks run beside zeps (a lone server, and a 3-server R3 cluster).
package tools

import (
	_ "github.com/nats-io/nats-server/v2"
)
