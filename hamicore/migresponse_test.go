package hamicore_test

import (
	"fmt"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/hamireg/hamireg/allocation"
	"github.com/hamireg/hamireg/hamicore"
)

func TestMIGResponse(t *testing.T) {
	t.Parallel()
	const a, b = "MIG-5a5a0000-0001-0000-1111-abcdef000001", "MIG-5a5a0000-0002-0000-1111-abcdef000002"
	tests := map[string]struct {
		uuids   []string
		opts    hamicore.EnvOptions
		want    allocation.Response
		wantErr bool
	}{
		"envvar": {
			uuids: []string{a, b},
			want:  allocation.Response{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": a + "," + b}},
		},
		"index strategy lists the MIG UUIDs": {
			uuids: []string{a}, opts: hamicore.EnvOptions{DeviceIDStrategy: hamicore.DeviceIDIndex},
			want: allocation.Response{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": a}},
		},
		"volume-mounts": {
			uuids: []string{a, b}, opts: hamicore.EnvOptions{DeviceListStrategy: hamicore.DeviceListVolumeMounts},
			want: allocation.Response{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": hamicore.ContainerDevicesDir}, Mounts: []allocation.Mount{
				{ContainerPath: hamicore.ContainerDevicesDir + "/" + a, HostPath: "/dev/null"},
				{ContainerPath: hamicore.ContainerDevicesDir + "/" + b, HostPath: "/dev/null"},
			}},
		},
		"none":       {wantErr: true},
		"empty UUID": {uuids: []string{a, ""}, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := hamicore.MIGResponse(tc.uuids, tc.opts)
			if (err != nil) != tc.wantErr {
				t.Fatalf("MIGResponse = %v, want error %v", err, tc.wantErr)
			}
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The answer for a container served two MIG devices: their UUIDs alone, none of HAMi-core's
// limits or mounts.
func ExampleMIGResponse() {
	r, err := hamicore.MIGResponse([]string{"MIG-5a5a0000-0001-0000-1111-abcdef000001", "MIG-5a5a0000-0002-0000-1111-abcdef000002"}, hamicore.EnvOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Envs, len(r.Mounts), r.StateDir == "")
	// Output:
	// map[NVIDIA_VISIBLE_DEVICES:MIG-5a5a0000-0001-0000-1111-abcdef000001,MIG-5a5a0000-0002-0000-1111-abcdef000002] 0 true
}
