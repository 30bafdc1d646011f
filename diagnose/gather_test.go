package diagnose

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

func deployment(containers ...corev1.Container) *appsv1.Deployment {
	d := &appsv1.Deployment{}
	d.Spec.Template.Spec.Containers = containers
	return d
}

func TestSchedulerArgs(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		containers  []corev1.Container
		want        map[string]string
		leaderElect bool
		wantErr     bool
	}{
		"none": {containers: []corev1.Container{{Name: "vgpu-scheduler-extender", Command: []string{"scheduler", "-v=4"}}}, leaderElect: true},
		"equals form": {containers: []corev1.Container{{Name: "vgpu-scheduler-extender", Command: []string{"scheduler"}, Args: []string{"--node-label-selector=gpu=on,pool=a"}}},
			want: map[string]string{"gpu": "on", "pool": "a"}, leaderElect: true},
		"separate value, single dash": {containers: []corev1.Container{{Name: "vgpu-scheduler-extender", Args: []string{"-node-label-selector", "gpu=on"}}},
			want: map[string]string{"gpu": "on"}, leaderElect: true},
		"repeated flags merge": {containers: []corev1.Container{{Name: "vgpu-scheduler-extender", Args: []string{"--node-label-selector=a=1", "--node-label-selector=b=2"}}},
			want: map[string]string{"a": "1", "b": "2"}, leaderElect: true},
		"other container ignored": {containers: []corev1.Container{
			{Name: "kube-scheduler", Args: []string{"--node-label-selector=x=y"}},
			{Name: "vgpu-scheduler-extender", Args: []string{"--leader-elect=false"}}}},
		"no extender container: all searched": {containers: []corev1.Container{{Name: "custom", Args: []string{"--node-label-selector=x=y"}}},
			want: map[string]string{"x": "y"}, leaderElect: true},
		"bad pair": {containers: []corev1.Container{{Name: "vgpu-scheduler-extender", Args: []string{"--node-label-selector=gpu"}}}, leaderElect: true, wantErr: true},
		"flag without value at the end": {containers: []corev1.Container{{Name: "vgpu-scheduler-extender", Args: []string{"--node-label-selector"}}},
			want: map[string]string{}, leaderElect: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, le, err := schedulerArgs(deployment(tc.containers...), DefaultExtenderContainer)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if tc.wantErr {
				return
			}
			if !cmp.Equal(got, tc.want) || le != tc.leaderElect {
				t.Errorf("got %v %v, want %v %v", got, le, tc.want, tc.leaderElect)
			}
		})
	}
}

// FuzzSchedulerArgs: any argument list parses or fails cleanly, and a parsed selector
// round-trips through its rendering.
func FuzzSchedulerArgs(f *testing.F) {
	for _, s := range []string{"--node-label-selector=gpu=on", "--node-label-selector", "-node-label-selector=a=b,c=d", "--leader-elect=false", "", "=", "--node-label-selector=,", "--node-label-selector='a=b'"} {
		f.Add(s, "gpu=on")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		sel, _, err := schedulerArgs(deployment(corev1.Container{Name: DefaultExtenderContainer, Args: []string{a, b}}), DefaultExtenderContainer)
		if err != nil {
			return
		}
		for k := range sel {
			if k == "" {
				t.Fatalf("empty key from %q %q", a, b)
			}
		}
		_ = matchesSelector(map[string]string{"gpu": "on"}, sel)
	})
}
