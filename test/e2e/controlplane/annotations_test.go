package controlplane_test

import (
	"fmt"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// Two writers patch different annotations of one Node at the same time, as HAMi's device
// plugin (register annotation) and scheduler (handshake annotation) do. JSON merge patches
// without a resourceVersion never conflict, and neither writer may erase the other's key.
func TestConcurrentAnnotationWritersBothSurvive(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := harness.UniqueName("concurrent")
	createNode(t, name, nil)

	const rounds = 25
	writers := map[string]func(i int) string{
		annotation.KeyNVIDIARegister: func(i int) string {
			return annotation.Encode([]annotation.Device{{ID: fmt.Sprintf("GPU-%d", i), Count: 10, Devmem: 1024, Devcore: 100, Type: "NVIDIA-T4", Mode: "hami-core", Health: true}})
		},
		annotation.KeyNVIDIAHandshake: func(i int) string { return fmt.Sprintf("Requesting_2026-01-01 00:00:%02d", i) },
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*rounds)
	for key, value := range writers {
		wg.Go(func() {
			for i := range rounds {
				if err := patchAnnotations(ctx, name, annotationMergePatch(map[string]string{key: value(i)})); err != nil {
					errs <- fmt.Errorf("patch %s #%d: %w", key, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	for key, value := range writers {
		if got, want := n.Annotations[key], value(rounds-1); got != want {
			t.Errorf("annotation %s = %q, want the last write %q", key, got, want)
		}
	}
}

// A JSON merge patch with a null value deletes one annotation and leaves the others.
func TestMergePatchNullDeletesOnlyThatAnnotation(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := harness.UniqueName("nulldelete")
	createNode(t, name, nil)
	if err := patchAnnotations(ctx, name, []byte(`{"metadata":{"annotations":{"a.example.com/x":"1","b.example.com/y":"2"}}}`)); err != nil {
		t.Fatalf("patch: %v", err)
	}
	if err := patchAnnotations(ctx, name, []byte(`{"metadata":{"annotations":{"a.example.com/x":null}}}`)); err != nil {
		t.Fatalf("patch null: %v", err)
	}
	n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	if _, ok := n.Annotations["a.example.com/x"]; ok {
		t.Errorf("a.example.com/x still present: %v", n.Annotations)
	}
	if n.Annotations["b.example.com/y"] != "2" {
		t.Errorf("b.example.com/y = %q, want 2", n.Annotations["b.example.com/y"])
	}
}
