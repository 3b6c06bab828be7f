//go:build tools

// Package tools pins SeaweedFS (Apache-2.0), whose `weed server -s3` is the S3-compatible object
// store the batch-store tests run against (zeps_dev.seaweedfs), and the e2e suite runs in a pod.
package tools

import (
	_ "github.com/seaweedfs/seaweedfs/weed"
)
