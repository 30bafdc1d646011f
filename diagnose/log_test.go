package diagnose

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A crash whose termination message says nothing is explained from the container's previous
// log: NVML errors there make it case 2 NVMLUnavailable, with the log lines as evidence; a log
// that cannot be read leaves the command to read it.
func TestCrashExplainedFromPreviousLog(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-device-plugin-abcde", Namespace: DefaultNamespace,
			Labels: map[string]string{"app.kubernetes.io/component": "hami-device-plugin"}},
		Spec: corev1.PodSpec{NodeName: "gpu-1", Containers: []corev1.Container{{Name: DefaultPluginContainer,
			Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: DefaultPluginContainer, RestartCount: 4,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"}}}}},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{"gpu": "on"}}}
	tests := map[string]struct {
		log      string
		err      error
		wantCode string
		want     string
	}{
		"NVML in the log": {
			log:      "I1130 09:12:01 main.go:257] Starting Plugins.\nE1130 09:12:01 register.go:93] nvml Init err: ERROR_LIBRARY_NOT_FOUND\npanic: 0\n",
			wantCode: CodeNVMLUnavailable, want: "previous log: E1130 09:12:01 register.go:93] nvml Init err: ERROR_LIBRARY_NOT_FOUND",
		},
		"nothing telling": {log: "I1130 09:12:01 main.go:257] Starting Plugins.\n", wantCode: CodePluginCrashing,
			want: "previous log: I1130 09:12:01 main.go:257] Starting Plugins."},
		"not readable": {err: errors.New("no preferred addresses found"), wantCode: CodePluginCrashing,
			want: "previous log not readable here (no preferred addresses found): run kubectl -n kube-system logs hami-device-plugin-abcde -c device-plugin --previous"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts, err := Options{}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			c := gather(t.Context(), fake.NewClientset(node, pod), opts, "gpu-1")
			var asked string
			c.readLog = func(_ context.Context, p *corev1.Pod, container string) (string, error) {
				asked = p.Name + "/" + container
				return tc.log, tc.err
			}
			r := c.analyze(t.Context(), node)
			if asked != "hami-device-plugin-abcde/device-plugin" {
				t.Errorf("log read for %q", asked)
			}
			f, ok := r.Finding(tc.wantCode)
			if !ok || r.Case != CasePluginNotRunning {
				t.Fatalf("case %v, findings %+v", r.Case, r.Findings)
			}
			if !strings.Contains(strings.Join(f.Evidence, "\n"), tc.want) {
				t.Errorf("evidence lacks %q: %q", tc.want, f.Evidence)
			}
		})
	}
}
