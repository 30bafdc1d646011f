package register_test

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/hamireg/hamireg/register"
)

// The ClusterRole manifest in the package documentation is the one ClusterRoleRules returns
// (the e2e tests prove those rules are enough).
func TestClusterRoleManifestMatchesRules(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var manifest []string
	in := false
	for line := range strings.Lines(string(src)) {
		body, isCode := strings.CutPrefix(line, "//\t")
		switch {
		case isCode && strings.HasPrefix(body, "apiVersion: rbac.authorization.k8s.io/v1"):
			in = true
		case !isCode:
			in = false
		}
		if in {
			manifest = append(manifest, body)
		}
	}
	if len(manifest) == 0 {
		t.Fatal("no ClusterRole manifest in doc.go")
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict([]byte(strings.Join(manifest, "")), &role); err != nil {
		t.Fatalf("parse the manifest: %v\n%s", err, strings.Join(manifest, ""))
	}
	if role.Kind != "ClusterRole" {
		t.Errorf("kind %q", role.Kind)
	}
	if d := cmp.Diff(register.ClusterRoleRules(), role.Rules); d != "" {
		t.Errorf("doc.go manifest differs from ClusterRoleRules (-code +doc):\n%s", d)
	}
}
