//go:build tools

// Package tools pins the commands built from this module (see go.mod): Kubernetes' control plane and
// node commands, kwok, kube-router and the CSI sidecars.
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
	_ "github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-resizer/cmd/csi-resizer"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
