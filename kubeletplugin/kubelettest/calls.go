package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ErrNoPlugin means no plugin is connected for the resource a call names.
var ErrNoPlugin = errors.New("no connected device plugin")

// ErrNotEnoughDevices means [Kubelet.PickHealthy] found fewer healthy, unallocated devices
// than asked for: the kubelet would reject the pod (UnexpectedAdmissionError).
var ErrNotEnoughDevices = errors.New("not enough healthy devices")

// plugin returns the client of the connected plugin for resourceName, on the connection the
// fake dialed at its Register, and the plugin as last seen.
func (k *Kubelet) plugin(resourceName string) (pluginapi.DevicePluginClient, Plugin, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for path, p := range k.state.Plugins {
		if p.ResourceName != resourceName || !p.Connected {
			continue
		}
		if conn, ok := k.conns[path]; ok {
			return pluginapi.NewDevicePluginClient(conn), p, nil
		}
	}
	return nil, Plugin{}, fmt.Errorf("kubelettest: resource %s: %w", resourceName, ErrNoPlugin)
}

// Allocate calls the plugin's Allocate for resourceName as the kubelet's device manager does
// when it admits a pod: one ContainerAllocateRequest per container, each with the replica IDs
// (the IDs of ListAndWatch) the container gets. The kubelet sends one container per call; more
// are allowed here to test a plugin's handling of them. The IDs of a successful call are
// recorded in [State.Allocated]. The error is the plugin's gRPC status, or [ErrNoPlugin].
func (k *Kubelet) Allocate(ctx context.Context, resourceName string, containers ...[]string) (*pluginapi.AllocateResponse, error) {
	c, _, err := k.plugin(resourceName)
	if err != nil {
		return nil, err
	}
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	resp, err := c.Allocate(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("kubelettest: Allocate %s: %w", resourceName, err)
	}
	if n := len(resp.GetContainerResponses()); n != len(containers) {
		return resp, fmt.Errorf("kubelettest: Allocate %s: %d container response(s) for %d request(s)", resourceName, n, len(containers))
	}
	k.mu.Lock()
	for _, ids := range containers {
		k.state.Allocated[resourceName] = append(k.state.Allocated[resourceName], ids...)
	}
	k.notify()
	k.mu.Unlock()
	return resp, nil
}

// GetPreferredAllocation calls the plugin's GetPreferredAllocation for one container, as the
// kubelet does before Allocate when the plugin advertises it: available are the replica IDs
// the kubelet may give, mustInclude those it must, size how many the container asks for.
func (k *Kubelet) GetPreferredAllocation(ctx context.Context, resourceName string, available, mustInclude []string, size int32) (*pluginapi.PreferredAllocationResponse, error) {
	c, _, err := k.plugin(resourceName)
	if err != nil {
		return nil, err
	}
	resp, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude, AllocationSize: size},
	}})
	if err != nil {
		return nil, fmt.Errorf("kubelettest: GetPreferredAllocation %s: %w", resourceName, err)
	}
	return resp, nil
}

// PreStartContainer calls the plugin's PreStartContainer with the container's replica IDs.
// The kubelet calls it only when the plugin's options set PreStartRequired
// ([Plugin.Options]); the fake calls it whenever the test does.
func (k *Kubelet) PreStartContainer(ctx context.Context, resourceName string, ids []string) (*pluginapi.PreStartContainerResponse, error) {
	c, _, err := k.plugin(resourceName)
	if err != nil {
		return nil, err
	}
	resp, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids})
	if err != nil {
		return nil, fmt.Errorf("kubelettest: PreStartContainer %s: %w", resourceName, err)
	}
	return resp, nil
}

// PickHealthy chooses n replica IDs of resourceName for a container the way the kubelet's
// device manager does: from the healthy devices of the plugin's last ListAndWatch list that
// no earlier [Kubelet.Allocate] handed out ([State.Allocated]); when the plugin advertises
// GetPreferredAllocation, it asks the plugin and takes its answer if that is n of those
// devices, else (and without the option) the first n of them in sorted order. The IDs are
// what a test then passes to Allocate. Fewer than n available is [ErrNotEnoughDevices].
func (k *Kubelet) PickHealthy(ctx context.Context, resourceName string, n int) ([]string, error) {
	_, p, err := k.plugin(resourceName)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	taken := slices.Clone(k.state.Allocated[resourceName])
	k.mu.Unlock()
	var available []string
	for _, d := range p.Devices {
		if d.GetHealth() == pluginapi.Healthy && !slices.Contains(taken, d.GetID()) {
			available = append(available, d.GetID())
		}
	}
	slices.Sort(available)
	if len(available) < n {
		return nil, fmt.Errorf("kubelettest: resource %s: %d of %d asked for: %w", resourceName, len(available), n, ErrNotEnoughDevices)
	}
	if p.Options.GetGetPreferredAllocationAvailable() {
		resp, err := k.GetPreferredAllocation(ctx, resourceName, available, nil, int32(n)) //nolint:gosec // n is a small device count
		if err != nil {
			return nil, err
		}
		if cr := resp.GetContainerResponses(); len(cr) == 1 && validPick(cr[0].GetDeviceIDs(), available, n) {
			return slices.Clone(cr[0].GetDeviceIDs()), nil
		}
	}
	return available[:n:n], nil
}

// validPick reports whether ids are n distinct members of available.
func validPick(ids, available []string, n int) bool {
	if len(ids) != n {
		return false
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] || !slices.Contains(available, id) {
			return false
		}
		seen[id] = true
	}
	return true
}
