package register_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/clienttest"
	"github.com/hamireg/hamireg/register"
)

// TestMain fails the binary if any test leaves a goroutine behind: every Run must join what
// it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// shuffled returns devs in a new random order, as HAMi's map iteration lists them.
func shuffled(devs []annotation.Device) []annotation.Device {
	out := slices.Clone(devs)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// newWriter returns a Writer of node gpu-1 that has been given devs, in a random order.
func newWriter(cs *fake.Clientset, devs []annotation.Device, opts register.Options) (*register.Writer, error) {
	w, err := register.New(cs, nodeName, opts)
	if err != nil {
		return nil, err
	}
	w.SetDevices(shuffled(devs))
	return w, nil
}

// syncs counts the syncs a Writer has made.
func syncs(w *register.Writer) uint64 {
	s := w.Stats()
	return s.Writes + s.NoOps + s.Failures
}

// gpus returns n healthy A100s.
func gpus(n int) []annotation.Device {
	devs := make([]annotation.Device, n)
	for i := range devs {
		devs[i] = annotation.Device{
			ID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), Index: uint(i), Count: 10,
			Devmem: 81920, Devcore: 100, Type: "NVIDIA-A100-SXM4-80GB", Numa: i / 4, Mode: "hami-core", Health: true,
		}
	}
	return devs
}

func want(devs []annotation.Device) string { return annotation.Encode(annotation.Canonical(devs)) }

// nodeName is the Node every unit test writes to.
const nodeName = "gpu-1"

func newNode(annotations map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Annotations: annotations, ResourceVersion: nextRV()}}
}

func nextRV() string { return clienttest.NextResourceVersion() }

// newClientset returns a fake clientset holding objs whose node patches, like the API
// server's, give the Node a new resourceVersion (the fake's own leave it unchanged).
func newClientset(objs ...runtime.Object) *fake.Clientset {
	cs := fake.NewClientset(objs...)
	clienttest.ResourceVersions(cs)
	return cs
}

// count returns how many actions with verb on nodes the fake clientset has seen.
func count(cs *fake.Clientset, verb string) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == "nodes" {
			n++
		}
	}
	return n
}

// nodeAnnotation reads the node's annotation straight from the fake's tracker.
func nodeAnnotation(t *testing.T, cs *fake.Clientset, key string) (string, bool) {
	t.Helper()
	obj, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", nodeName)
	if err != nil {
		t.Fatalf("get node from the tracker: %v", err)
	}
	v, ok := obj.(*corev1.Node).Annotations[key]
	return v, ok
}

// setAnnotations replaces the node's annotations the way kubectl annotate would (an update
// that the writer's watch sees), bypassing the reactors.
func setAnnotations(t *testing.T, cs *fake.Clientset, annotations map[string]string) {
	t.Helper()
	gvr := corev1.SchemeGroupVersion.WithResource("nodes")
	obj, err := cs.Tracker().Get(gvr, "", nodeName)
	if err != nil {
		t.Fatalf("get node from the tracker: %v", err)
	}
	n := obj.(*corev1.Node).DeepCopy()
	n.Annotations = annotations
	n.ResourceVersion = nextRV()
	if err := cs.Tracker().Update(gvr, n, ""); err != nil {
		t.Fatalf("update node: %v", err)
	}
}

// failPatches makes the next n patches of nodes fail with err (n < 0: all).
func failPatches(cs *fake.Clientset, n int, err error) {
	clienttest.Fail(&cs.Fake, "patch", "nodes", n, err)
}

// settled waits until every other goroutine of the test's synctest bubble is blocked, so that
// whatever the test set off has run to its end, and fails the test unless cond then holds.
func settled(t *testing.T, what string, cond func() bool) {
	t.Helper()
	synctest.Wait()
	if !cond() {
		t.Fatalf("still waiting for %s once the bubble settled", what)
	}
}
