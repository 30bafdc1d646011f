package drahealth_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/hamireg/hamireg/diagnose"
	"github.com/hamireg/hamireg/test/e2e/harness"
)

// TestHealthDRA: an XID on the DRA GPU that pod a's claim holds turns that device Unhealthy
// in a's status, with the driver's message naming the GPU; pod b's claim device (another
// DRA GPU) and pod c's device-plugin device stay Healthy; once the scan recovers the GPU, a's
// device is Healthy again.
func TestHealthDRA(t *testing.T) {
	t.Parallel()
	n := startHealthNode(t)
	a, idA := n.claimPod(t, "a", 2)
	b, idB := n.claimPod(t, "b", 3)
	c, idC := n.devicePluginPod(t, "c", dpGPU0)
	if want := "k8s.hamireg.io/claim="; !strings.HasPrefix(string(idA), want) {
		t.Errorf("resource ID %s, want the claim's CDI device ID %s<claim UID>-gpu-2", idA, want)
	}

	w := watchPod(t, a.Namespace, a.Name)
	n.sim.XID(2, 79)
	got, _ := until(t, w, "pod a's claim device Unhealthy", healthIs(draResourceName, idA, corev1.ResourceHealthStatusUnhealthy))
	t.Logf("pod a's container status after the XID: %s", describe(got.Status.ContainerStatuses[0].AllocatedResourcesStatus))
	if msg := message(got, draResourceName, idA); !strings.Contains(msg, n.sim.UUID(2)) {
		t.Errorf("pod a's health message %q does not name GPU 2 (%s)", msg, n.sim.UUID(2))
	}
	// The doctor reads it as evidence: the pod's claim holds an unhealthy GPU, on the
	// kubelet's word (allocatedResourcesStatus), with the fix.
	rep, err := diagnose.Pod(harness.Context(t), cp.AdminClient(), a.Namespace, a.Name, diagnose.Options{MonitorPort: -1})
	if err != nil {
		t.Fatal(err)
	}
	f, ok := rep.Finding(diagnose.CodeDeviceUnhealthy)
	if !ok || f.Case != diagnose.P12DeviceUnhealthy || !strings.Contains(f.Summary, n.sim.UUID(2)) ||
		!strings.Contains(strings.Join(f.Evidence, "\n"), "Unhealthy in the pod's allocatedResourcesStatus") {
		t.Errorf("the doctor on pod a after the XID: finding %+v (found %t), want %s naming GPU 2 on the kubelet's evidence", f, ok, diagnose.CodeDeviceUnhealthy)
	}
	for _, o := range []struct {
		pod  *corev1.Pod
		name corev1.ResourceName
		id   corev1.ResourceID
	}{{b, draResourceName, idB}, {c, harness.GPUResource, idC}} {
		if h := health(n.getPod(t.Context(), t, o.pod.Name), o.name)[o.id]; h != corev1.ResourceHealthStatusHealthy {
			t.Errorf("pod %s's device %s reads %q after GPU 2's XID, want Healthy", o.pod.Name, o.id, h)
		}
	}

	w = watchPod(t, a.Namespace, a.Name)
	n.recover()
	until(t, w, "pod a's claim device Healthy again after the recovery", healthIs(draResourceName, idA, corev1.ResourceHealthStatusHealthy))
}

// TestHealthDevicePlugin: the same through the device plugin's ListAndWatch and the kubelet's
// device manager: an XID on the GPU of HAMi pod a turns its replica Unhealthy under
// nvidia.com/gpu in a's status; pod b on the other device-plugin GPU and pod c's DRA claim
// stay Healthy; the recovery turns a's device Healthy again.
func TestHealthDevicePlugin(t *testing.T) {
	t.Parallel()
	n := startHealthNode(t)
	a, idA := n.devicePluginPod(t, "a", dpGPU0)
	b, idB := n.devicePluginPod(t, "b", dpGPU0+1)
	c, idC := n.claimPod(t, "c", 0)

	w := watchPod(t, a.Namespace, a.Name)
	n.sim.XID(dpGPU0, 79)
	got, _ := until(t, w, "pod a's device Unhealthy", healthIs(harness.GPUResource, idA, corev1.ResourceHealthStatusUnhealthy))
	t.Logf("pod a's container status after the XID: %s", describe(got.Status.ContainerStatuses[0].AllocatedResourcesStatus))
	for _, o := range []struct {
		pod  *corev1.Pod
		name corev1.ResourceName
		id   corev1.ResourceID
	}{{b, harness.GPUResource, idB}, {c, draResourceName, idC}} {
		if h := health(n.getPod(t.Context(), t, o.pod.Name), o.name)[o.id]; h != corev1.ResourceHealthStatusHealthy {
			t.Errorf("pod %s's device %s reads %q after GPU %d's XID, want Healthy", o.pod.Name, o.id, h, dpGPU0)
		}
	}

	w = watchPod(t, a.Namespace, a.Name)
	n.recover()
	until(t, w, "pod a's device Healthy again after the recovery", healthIs(harness.GPUResource, idA, corev1.ResourceHealthStatusHealthy))
}
