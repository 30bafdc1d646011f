package controlplane_test

import (
	"os"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/test/e2e/harness"
)

// The apiserver reports the version the harness was built for, the k8s.io/kubernetes
// release that the test module's go.mod requires: the peers are the real thing, from the
// same release whose packages (the kubelet's device manager) the tests link.
func TestServerVersionIsTheRealOne(t *testing.T) {
	t.Parallel()
	// go test runs a package's tests in its folder; go.mod is one level up.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for line := range strings.Lines(string(gomod)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "k8s.io/kubernetes" {
			want = f[1]
		}
	}
	if want == "" {
		t.Fatal("test/e2e/go.mod does not require k8s.io/kubernetes")
	}
	v, err := cp.AdminClient().Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("GET /version: %v", err)
	}
	if v.GitVersion != want {
		t.Errorf("apiserver /version = %s, want %s (rebuild with hack/k8sbins/build.sh)", v.GitVersion, want)
	}
	t.Logf("kube-apiserver %s (%s), etcd %s", v.GitVersion, v.Platform, cp.EtcdVersion())
}

// Stopping kube-apiserver and starting it again on the same port keeps the data (etcd
// keeps running) and the clients made before the restart work again afterwards. This test
// must not be parallel: the apiserver is down for a while.
func TestAPIServerRestartKeepsDataAndClients(t *testing.T) {
	ctx := t.Context()
	name := harness.UniqueName("restart")
	createNode(t, name, map[string]string{harness.TestLabel: name})
	client := cp.AdminClient()
	before := cp.APIServerPid()

	if err := cp.StopAPIServer(); err != nil {
		t.Fatalf("stop apiserver: %v", err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Fatal("GET succeeded while the apiserver was stopped")
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatalf("start apiserver: %v", err)
	}
	if after := cp.APIServerPid(); after == before || after == 0 {
		t.Errorf("apiserver pid %d after restart, was %d: not a new process", after, before)
	}
	n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("GET after restart with the old client: %v", err)
	}
	if n.Labels[harness.TestLabel] != name {
		t.Errorf("node labels after restart = %v", n.Labels)
	}
}
