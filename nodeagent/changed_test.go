package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/nodeagent"
	"github.com/hamireg/hamireg/register"
)

// hotplug is a source whose devices change at run time: it embeds nodeagent.Changes.
type hotplug struct {
	nodeagent.Changes
	mu      sync.Mutex
	devices []annotation.Device
}

func (h *hotplug) Devices(context.Context) ([]annotation.Device, []error, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]annotation.Device(nil), h.devices...), nil, nil
}

func (h *hotplug) add(d annotation.Device) {
	h.mu.Lock()
	h.devices = append(h.devices, d)
	h.mu.Unlock()
	h.Notify() // after the change: a waiter that wakes reads it
}

var _ nodeagent.Source = (*hotplug)(nil)

func ExampleChanges() {
	src := &hotplug{}
	changed := src.Changed() // take the channel, then read the devices
	devs, _, _ := src.Devices(context.Background())
	fmt.Println("devices:", len(devs))

	src.add(annotation.Device{ID: "NPU-a", Count: 4, Health: true})
	<-changed // closed by the change
	devs, _, _ = src.Devices(context.Background())
	fmt.Println("devices:", len(devs))
	// Output:
	// devices: 0
	// devices: 1
}

func TestChangesWakesEveryWaiterOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var c nodeagent.Changes
		first := c.Changed()
		if c.Changed() != first {
			t.Fatal("two Changed calls before a change returned different channels")
		}
		woken := 0
		var mu sync.Mutex
		for range 3 {
			go func() {
				<-first
				mu.Lock()
				woken++
				mu.Unlock()
			}()
		}
		synctest.Wait()
		if woken != 0 {
			t.Fatalf("%d waiters woke before Notify", woken)
		}
		c.Notify()
		synctest.Wait()
		if woken != 3 {
			t.Fatalf("%d of 3 waiters woke after Notify", woken)
		}
		next := c.Changed()
		select {
		case <-next:
			t.Fatal("the channel after Notify is already closed")
		default:
		}
		c.Notify()
		c.Notify() // two changes in a row close two channels, never one twice
		select {
		case <-next:
		default:
			t.Fatal("Notify did not close the channel Changed returned")
		}
	})
}

func TestNodeNameFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"NODE_NAME": "gpu-1"}
	got, err := nodeagent.NodeNameFromEnv(t.Context(), func(k string) string { return env[k] })
	if err != nil || got != "gpu-1" {
		t.Fatalf("NodeNameFromEnv = %q, %v; want gpu-1", got, err)
	}
	if _, err := nodeagent.NodeNameFromEnv(t.Context(), func(string) string { return "" }); !errors.Is(err, register.ErrNoNodeName) {
		t.Fatalf("NodeNameFromEnv without NODE_NAME: %v, want register.ErrNoNodeName", err)
	}
}
