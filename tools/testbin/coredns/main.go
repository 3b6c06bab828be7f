// Command coredns is CoreDNS v1.12.0 (the version kubeadm v1.33 deploys) with only the plugins the kind
// cluster's Corefile uses: kubeadm's default Corefile (errors, health, ready, kubernetes, prometheus,
// forward, cache, loop, reload, loadbalance). CoreDNS's own main links all of its ~60 plugins, among
// them cloud SDKs (route53, azure, clouddns) and tracers, which tripled the build's time; this one is
// CoreDNS's documented way to choose plugins (import them, and set dnsserver.Directives).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// the directives of the plugins above ("prometheus" is the metrics plugin's)
var plugins = map[string]bool{
	"cache": true, "errors": true, "forward": true, "health": true, "kubernetes": true,
	"loadbalance": true, "loop": true, "prometheus": true, "ready": true, "reload": true,
}

func init() {
	// CoreDNS runs a server block's plugins in the order of dnsserver.Directives: keep the pinned
	// version's order, only without the plugins not linked in.
	var kept []string
	for _, directive := range dnsserver.Directives {
		if plugins[directive] {
			kept = append(kept, directive)
		}
	}
	dnsserver.Directives = kept
}

func main() {
	coremain.Run()
}
