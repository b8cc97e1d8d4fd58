// etcd, as go.etcd.io/etcd/server/v3's own main.go builds it, in the same module as
// kube-apiserver so the two share one module graph and one build.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
