// Package attack_test attacks HAMi's protocol as served by this SDK, on real peers:
// kube-apiserver and etcd (harness) with an admission configuration that gives the API
// server a client certificate for webhooks, kube-scheduler calling examples/extender over
// TLS with its own client certificate (deploy/scheduler-config.yaml's tlsConfig), the
// extender's webhook registered from deploy/webhook.yaml, and examples/deviceplugin on the
// kubelet's device manager (the test plays the kubelet's admission). Each step asserts its
// exact outcome, and after every step the cluster is audited for GPUs double-booked: what
// the pods' allocation annotations hold of each GPU against what its register annotation
// offers.
package attack_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamireg/hamireg/envtest"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

var (
	// cp is the control plane shared by every test of this binary.
	cp *harness.ControlPlane
	// progs are examples/deviceplugin and examples/extender, built once.
	progs harness.Programs
	// certs are the test's PKI, made before the API server starts (it reads its webhook
	// client certificate from them).
	certs *pki
)

// TestMain makes the PKI, starts the control plane with the admission configuration that
// names the API server's webhook client certificate, and builds the programs.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hamireg-attack-")
	if err == nil {
		certs, err = newPKI(dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "attack: make the certificates: %v\n", err)
		os.Exit(1)
	}
	// The folder (certificates, a few KB) outlives the run: MainWithProgramsOptions exits the
	// process, and the API server reads its client certificate from it until then.
	harness.MainWithProgramsOptions(m, race, envtest.Options{APIServerFlags: []string{
		"--admission-control-config-file=" + filepath.Join(dir, "admission.yaml"),
	}}, func(c *harness.ControlPlane, p harness.Programs) {
		cp, progs = c, p
	})
}
