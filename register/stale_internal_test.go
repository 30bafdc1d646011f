package register

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/hamireg/hamireg/annotation"
)

// While the watch's copy of the Node is older than the Node the last patch produced, the
// value written stands in for the stale one: no second write. A newer copy without the
// value is drift and is written.
func TestSyncTrustsLastWriteOverStaleWatchCopy(t *testing.T) {
	t.Parallel()
	devs := []annotation.Device{{ID: "GPU-a", Count: 10, Health: true}}
	value := annotation.Encode(devs)
	tests := map[string]struct {
		storeRV     string
		writtenRV   string
		wantPatches int
	}{
		"copy older than the write":       {storeRV: "99", writtenRV: "100"},
		"copy much older than the write":  {storeRV: "7", writtenRV: "100"},
		"copy newer than the write":       {storeRV: "101", writtenRV: "100", wantPatches: 1},
		"copy is the write":               {storeRV: "100", writtenRV: "100", wantPatches: 1},
		"versions not comparable (fakes)": {storeRV: "", writtenRV: "100", wantPatches: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", ResourceVersion: tc.storeRV}}
			cs := fake.NewClientset(node.DeepCopy())
			w, err := New(cs, "gpu-1", Options{})
			if err != nil {
				t.Fatal(err)
			}
			w.SetDevices(devs)
			store := cache.NewStore(cache.MetaNamespaceKeyFunc)
			if err := store.Add(node); err != nil { // the watch's copy: no annotation
				t.Fatal(err)
			}
			w.store = store
			w.written.Store(&value)
			w.writtenRV.Store(&tc.writtenRV)
			if err := w.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			patches := 0
			for _, a := range cs.Actions() {
				if a.GetVerb() == "patch" {
					patches++
				}
			}
			if patches != tc.wantPatches {
				t.Errorf("%d patches, want %d", patches, tc.wantPatches)
			}
		})
	}
}
