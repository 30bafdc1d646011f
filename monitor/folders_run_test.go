package monitor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
)

// Run scans at once, then every Period (the default clock, in a synctest bubble); it returns
// nil when its context ends, leaving no goroutine behind, and refuses a second Run meanwhile.
// Not parallel: goleak compares the goroutines before and after.
func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, ContainersDir), 0o755); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		var rounds atomic.Int32
		pods := PodsFunc(func() ([]*corev1.Pod, error) {
			rounds.Add(1)
			return nil, nil
		})
		// The feedback round lists the pods too (the priority cross-check): off, so that the
		// count is the scans'.
		m, err := New(pods, Options{Root: root, NodeName: "node-1", Period: 5 * time.Second, DisableFeedback: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Ready(); !errors.Is(err, ErrNotReady) {
			t.Errorf("Ready before Run = %v, want ErrNotReady", err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		expect := func(what string, want int32) {
			t.Helper()
			synctest.Wait()
			if got := rounds.Load(); got != want {
				t.Errorf("%s: %d scans, want %d", what, got, want)
			}
		}
		expect("at start", 1)
		if err := m.Ready(); err != nil {
			t.Errorf("Ready after the first round: %v", err)
		}
		if err := m.Run(ctx); !errors.Is(err, ErrAlreadyRunning) {
			t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
		}
		time.Sleep(4 * time.Second)
		expect("before one period", 1)
		time.Sleep(time.Second)
		expect("after one period", 2)
		time.Sleep(10 * time.Second)
		expect("after three periods", 4)
		cancel()
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		default:
			t.Fatal("Run did not return after its context ended")
		}
		expect("after Run returned", 4)
		// It may run again once it returned; an ended context returns at once.
		if err := m.Run(ctx); err != nil {
			t.Errorf("Run after Run returned = %v", err)
		}
	})
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	if _, err := New(nil, Options{NodeName: "n"}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New(nil pods) = %v, want ErrInvalidOptions", err)
	}
	if _, err := New(PodsFunc(func() ([]*corev1.Pod, error) { return nil, nil }), Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New without NodeName = %v, want ErrInvalidOptions", err)
	}
}
