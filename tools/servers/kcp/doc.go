// Package kcp builds github.com/kcp-dev/kcp/cmd/kcp v0.31.2 from module zips (hack/build-servers.sh
// --with-kcp). kcp v0.32.x cannot be built this way: github.com/kcp-dev/virtual-workspace-framework
// is not served by the module proxy at any version but v0.31.2. Four k8s.io fork modules kcp
// v0.31.2 pins are not served either; go.mod uses upstream k8s.io v0.35.1 for them.
package kcp
