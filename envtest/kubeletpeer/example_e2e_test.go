//go:build e2e

package kubeletpeer_test

import (
	"io"
	"os"
	"testing"
)

// TestExample runs Example, which needs the peers and so carries no Output comment, and
// checks what it prints, as `go test` checks an Example's output. It does not run in
// parallel: it swaps os.Stdout while Example runs.
func TestExample(t *testing.T) {
	want := "kubelet: nvidia.com/gpu capacity 10 allocatable 10\n" +
		"devices: [GPU-a-0]\n" +
		"NVIDIA_VISIBLE_DEVICES=GPU-a\n" +
		"CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n" +
		"CUDA_DEVICE_SM_LIMIT=30\n" +
		"bind-phase: success\n"
	if got := stdoutOf(t, Example); got != want {
		t.Errorf("Example printed\n%s\nwant\n%s", got, want)
	}
}

// stdoutOf returns what f writes to os.Stdout.
func stdoutOf(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		out <- string(b)
	}()
	defer func() {
		os.Stdout = stdout
		_ = w.Close()
		_ = r.Close()
	}()
	f()
	os.Stdout = stdout
	_ = w.Close()
	return <-out
}
