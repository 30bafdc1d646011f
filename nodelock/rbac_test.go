package nodelock_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/hamireg/hamireg/nodelock"
)

// The ClusterRole manifest in the package documentation lists exactly the rules that
// ClusterRoleRules returns (the e2e tests prove those rules are enough).
func TestClusterRoleManifestMatchesRules(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	quote := func(s []string) string { return `["` + strings.Join(s, `", "`) + `"]` }
	var want strings.Builder
	want.WriteString("//\trules:\n")
	for _, r := range nodelock.ClusterRoleRules() {
		fmt.Fprintf(&want, "//\t- apiGroups: %s\n//\t  resources: %s\n//\t  verbs: %s\n", quote(r.APIGroups), quote(r.Resources), quote(r.Verbs))
	}
	want.WriteString("//\n")
	if !strings.Contains(string(src), want.String()) {
		t.Errorf("doc.go does not list the rules of ClusterRoleRules; want\n%s", want.String())
	}
}
