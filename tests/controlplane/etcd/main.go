// Command etcd is etcd's own main, built from go.etcd.io/etcd/server/v3 at the
// version go.mod pins, so that it is built with the same toolchain and cache as
// the Kubernetes binaries.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
