package draplugin

import (
	"context"
	"slices"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultHealthCheckTimeout is the lease the plugin asks the kubelet to put on each device's
// health (DeviceHealth.HealthCheckTimeout): the kubelet's own default, 30 s. The plugin
// re-sends the full state every third of it.
const DefaultHealthCheckTimeout = 30 * time.Second

// healthState is the plugin's device health, derived from the devices of the last
// SetDevices; guarded by Plugin.mu.
type healthState struct {
	// devices are the published devices' health, in slice order (LastUpdated unset).
	devices []kubeletplugin.DeviceHealth
	// changed is closed when devices change, then replaced.
	changed chan struct{}
	// stop is closed when Run ends; nil while Run does not run.
	stop chan struct{}
	// watchers counts the WatchHealthStatus calls of the current Run; Run waits for them.
	watchers sync.WaitGroup
}

// deviceHealth is the health of the published devices: Unhealthy for a device with the
// profile's <driver>/unhealthy taint (the scan marked its GPU unhealthy), Healthy otherwise.
func (p *Plugin) deviceHealth(devices []resourcev1.Device) []kubeletplugin.DeviceHealth {
	key := p.opts.Profile.UnhealthyTaint()
	out := make([]kubeletplugin.DeviceHealth, 0, len(devices))
	for _, d := range devices {
		h := kubeletplugin.DeviceHealth{
			PoolName:           p.opts.NodeName,
			DeviceName:         d.Name,
			Health:             kubeletplugin.HealthStatusHealthy,
			HealthCheckTimeout: p.healthTimeout,
		}
		if slices.ContainsFunc(d.Taints, func(t resourcev1.DeviceTaint) bool { return t.Key == key }) {
			h.Health = kubeletplugin.HealthStatusUnhealthy
			h.Message = "the node agent's scan marks GPU " + deviceUUID(d) + " unhealthy (a critical XID, or the GPU stopped answering NVML); " +
				"the ResourceSlice device carries the taint " + key + " until the GPU recovers"
		}
		out = append(out, h)
	}
	return out
}

// deviceUUID is the GPU UUID attribute of d, or its name when it has none.
func deviceUUID(d resourcev1.Device) string {
	if a, ok := d.Attributes["uuid"]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return d.Name
}

// setHealthLocked records the health of devices and wakes the watchers when it changed.
// p.mu is held.
func (p *Plugin) setHealthLocked(devices []resourcev1.Device) {
	h := p.deviceHealth(devices)
	if p.haveDevices && slices.Equal(h, p.health.devices) {
		return
	}
	p.health.devices = h
	close(p.health.changed)
	p.health.changed = make(chan struct{})
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: it sends the health of every
// published device (pool = node name, device = the slice device's name) at once, again at
// every change of the devices' health set by [Plugin.SetDevices] (the scan that taints an
// unhealthy GPU's device also marks it Unhealthy here), and the full state every third of
// Options.HealthCheckTimeout so that the kubelet's lease does not expire. Before the first
// SetDevices it sends nothing and waits. It returns nil when ctx ends or Run ends, and
// kubeletplugin.ErrHealthNotSupported at once with Options.DisableHealthService.
func (p *Plugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if p.opts.DisableHealthService {
		return kubeletplugin.ErrHealthNotSupported
	}
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	stop := p.health.stop
	if stop != nil {
		p.health.watchers.Add(1)
		defer p.health.watchers.Done()
	}
	p.mu.Unlock()
	p.healthWatchers.Add(1)
	defer p.healthWatchers.Add(-1)

	ticker := p.clock.NewTicker(p.healthTimeout / 3)
	defer ticker.Stop()
	send := true
	for {
		p.mu.Lock()
		have, changed := p.haveDevices, p.health.changed
		report := kubeletplugin.DeviceHealthReport{Devices: slices.Clone(p.health.devices)}
		p.mu.Unlock()
		if have && send {
			now := p.clock.Now()
			unhealthy := 0
			for i := range report.Devices {
				report.Devices[i].LastUpdated = now
				if report.Devices[i].Health != kubeletplugin.HealthStatusHealthy {
					unhealthy++
				}
			}
			select {
			case reports <- report:
				p.healthReports.Add(1)
				logger.V(5).Info("Device health sent to the kubelet", "driver", p.opts.Profile.Driver, "devices", len(report.Devices), "unhealthy", unhealthy)
			case <-ctx.Done():
				return nil
			case <-stop: // nil while Run does not run: never ready
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-stop:
			return nil
		case <-changed:
			send = true
		case <-ticker.C():
			send = true
		}
	}
}

// startHealth marks the start of a Run: WatchHealthStatus calls from now on end with it.
func (p *Plugin) startHealth() {
	p.mu.Lock()
	p.health.stop = make(chan struct{})
	p.mu.Unlock()
}

// stopHealth ends the WatchHealthStatus calls of the Run and waits for them.
func (p *Plugin) stopHealth() {
	p.mu.Lock()
	if p.health.stop != nil {
		close(p.health.stop)
		p.health.stop = nil
	}
	p.mu.Unlock()
	p.health.watchers.Wait()
}

// HealthWatchers is how many WatchHealthStatus calls are in progress (the kubelet holds one
// stream per registered plugin).
func (p *Plugin) HealthWatchers() int { return int(p.healthWatchers.Load()) }

// defaultClock is the clock of a Plugin without Options.Clock.
func defaultClock(c clock.WithTicker) clock.WithTicker {
	if c == nil {
		return clock.RealClock{}
	}
	return c
}
