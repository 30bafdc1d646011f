package nodelock_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/hamireg/hamireg/nodelock"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// createNode creates a Node with the given annotations; it is deleted at cleanup.
func createNode(tb testing.TB, name string, annotations map[string]string) {
	tb.Helper()
	cp.CreateNode(tb, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}})
}

// createPods creates the namespace and a Pod per name in it (nothing schedules or runs
// them: no scheduler, no kubelet) and returns their names.
func createPods(tb testing.TB, ns string, names ...string) []types.NamespacedName {
	tb.Helper()
	if err := cp.EnsureNamespace(tb.Context(), ns); err != nil {
		tb.Fatal(err)
	}
	out := make([]types.NamespacedName, 0, len(names))
	for _, name := range names {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/never-pulled:0"}}},
		}
		if _, err := cp.AdminClient().CoreV1().Pods(ns).Create(tb.Context(), pod, metav1.CreateOptions{}); err != nil {
			tb.Fatalf("create pod %s/%s: %v", ns, name, err)
		}
		out = append(out, types.NamespacedName{Namespace: ns, Name: name})
	}
	return out
}

// lockRole creates a ClusterRole with nodelock.ClusterRoleRules and returns its name.
func lockRole(tb testing.TB) string {
	tb.Helper()
	name := harness.UniqueName("hamireg-nodelock")
	_, err := cp.AdminClient().RbacV1().ClusterRoles().Create(tb.Context(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      nodelock.ClusterRoleRules(),
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create cluster role: %v", err)
	}
	return name
}

// serviceAccountClient returns a client of ServiceAccount ns/name bound to role.
func serviceAccountClient(tb testing.TB, ns, name, role string) kubernetes.Interface {
	tb.Helper()
	c, err := cp.ServiceAccountClient(tb.Context(), ns, name, role)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// lockOf returns the node's lock annotation, or "<absent>".
func lockOf(tb testing.TB, node string) string {
	tb.Helper()
	n, err := cp.AdminClient().CoreV1().Nodes().Get(tb.Context(), node, metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("get node %s: %v", node, err)
	}
	v, ok := n.Annotations[nodelock.Key]
	if !ok {
		return "<absent>"
	}
	return v
}

// newLocker returns a Locker of client with opts.
func newLocker(tb testing.TB, client kubernetes.Interface, opts nodelock.Options) *nodelock.Locker {
	tb.Helper()
	l, err := nodelock.New(client.CoreV1(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}
