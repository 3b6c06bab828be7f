// Command etcd is a minimal wrapper around the etcd server module, so etcd can be
// built from a pinned Go module version (etcd ships no installable main package).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
