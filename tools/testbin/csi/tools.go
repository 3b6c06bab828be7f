//go:build tools

// Package tools pins the CSI sidecars of the kind e2e cluster's expandable StorageClass: the
// upstream external-provisioner (run per node, --node-deployment) and external-resizer, beside
// zeps-csi-hostpath, the driver built from this module (see its main.go for why zeps has one).
package tools

import (
	_ "github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-resizer/cmd/csi-resizer"
)
