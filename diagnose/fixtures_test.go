package diagnose_test

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

const ns = "kube-system"

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var pluginLabels = map[string]string{"app.kubernetes.io/component": "hami-device-plugin", "app.kubernetes.io/name": "hami"}

func gpus(n int) []annotation.Device {
	out := make([]annotation.Device, n)
	for i := range out {
		out[i] = annotation.Device{ID: fmt.Sprintf("GPU-%08d-1111-2222-3333-444455556666", i), Index: uint(i), Count: 10,
			Devmem: 81559, Devcore: 100, Type: "NVIDIA H100 80GB HBM3", Numa: i / 4, Mode: "hami-core", Health: true}
	}
	return out
}

// gpuNode is a registered 8-GPU node: label gpu=on, allocatable 80, annotation, fresh handshake.
func gpuNode(name string) *corev1.Node {
	q := resource.MustParse("80")
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gpu": "on", "kubernetes.io/hostname": name},
			Annotations: map[string]string{
				annotation.KeyNVIDIARegister:  annotation.Encode(gpus(8)),
				annotation.KeyNVIDIAHandshake: handshake.Requesting(now.Add(-10*time.Second), time.UTC),
			}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{annotation.ResourceNVIDIAGPU: q},
			Allocatable: corev1.ResourceList{annotation.ResourceNVIDIAGPU: q},
		},
	}
}

func pluginDaemonSet() *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-device-plugin", Namespace: ns, Labels: pluginLabels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: pluginLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: pluginLabels},
				Spec:       pluginPodSpec(""),
			},
		},
	}
}

func pluginPodSpec(node string) corev1.PodSpec {
	return corev1.PodSpec{
		NodeName:           node,
		ServiceAccountName: "hami-device-plugin",
		NodeSelector:       map[string]string{"gpu": "on"},
		HostNetwork:        true,
		Containers: []corev1.Container{{
			Name:         "device-plugin",
			Image:        "projecthami/hami:v2.9.0",
			Command:      []string{"nvidia-device-plugin", "--config-file=/device-config.yaml", "--mig-strategy=none"},
			Env:          []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "device-plugin", MountPath: "/var/lib/kubelet/device-plugins"}},
		}},
		Volumes: []corev1.Volume{{Name: "device-plugin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/device-plugins"}}}},
	}
}

func runningPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-device-plugin-" + node, Namespace: ns, Labels: pluginLabels},
		Spec:       pluginPodSpec(node),
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "device-plugin", Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now.Add(-time.Hour))}}}},
		},
	}
}

func crashingPod(node, message string) *corev1.Pod {
	p := runningPod(node)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "device-plugin", RestartCount: 7,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: "back-off 5m0s restarting failed container=device-plugin"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error", Message: message}},
	}}
	return p
}

func schedulerDeployment(extraArgs ...string) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/component": "hami-scheduler"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler", Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{
				{Name: "kube-scheduler", Command: []string{"kube-scheduler", "--config=/config/config.yaml", "-v=4"}},
				{Name: "vgpu-scheduler-extender", Command: append([]string{"scheduler", "--http_bind=0.0.0.0:443", "--leader-elect=true", "-v=4"}, extraArgs...)},
			}}},
		},
	}
}

func schedulerPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler-7d9f8b6c5-x2x4q", Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/component": "hami-scheduler"}}}
}

func lease(holder string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "hami-scheduler", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: renewed}}}
}

// healthyObjects is a complete healthy installation around one node.
func healthyObjects(node string) []runtime.Object {
	return []runtime.Object{gpuNode(node), pluginDaemonSet(), runningPod(node), schedulerDeployment(), schedulerPod(),
		lease("hami-scheduler-7d9f8b6c5-x2x4q_2b1c0f7e-5f1d-4e7a-9a57-0c3f1f0b6d11", now.Add(-2*time.Second))}
}

// fakeClient serves objs; SubjectAccessReviews answer allowPatch.
func fakeClient(allowPatch bool, objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		sar.Status.Allowed = allowPatch
		if !allowPatch {
			sar.Status.Reason = "no RBAC policy matched"
		}
		return true, sar, nil
	})
	return c
}
