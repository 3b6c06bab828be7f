//go:build tools

// Package tools pins local-path-provisioner, the kind node's default StorageClass (volumes a
// non-root pod can write: it makes each volume's folder with the helper pod, mode 0777).
package tools

import (
	_ "github.com/rancher/local-path-provisioner"
)
