package kubeletplugin_test

import (
	"errors"
	"testing"

	"github.com/hamireg/hamireg/kubeletplugin"
)

func TestParseVirtualDeviceID(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		id      string
		uuid    string
		replica int
		wantErr bool
	}{
		"hami id":               {id: "GPU-0fc1a2b3-4c5d-6e7f-8091-a2b3c4d5e6f7-9", uuid: "GPU-0fc1a2b3-4c5d-6e7f-8091-a2b3c4d5e6f7", replica: 9},
		"two digits":            {id: "GPU-a-12", uuid: "GPU-a", replica: 12},
		"replica zero":          {id: "x-0", uuid: "x", replica: 0},
		"no dash":               {id: "GPU", wantErr: true},
		"empty uuid":            {id: "-3", wantErr: true},
		"empty replica":         {id: "GPU-a-", wantErr: true},
		"leading zero":          {id: "GPU-a-03", wantErr: true},
		"sign":                  {id: "GPU-a-+3", wantErr: true},
		"not a number":          {id: "GPU-a-b", wantErr: true},
		"overflow":              {id: "GPU-a-99999999999999999999", wantErr: true},
		"MIG id is not a split": {id: "MIG-4f5e", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			uuid, i, err := kubeletplugin.ParseVirtualDeviceID(tc.id)
			if tc.wantErr {
				if !errors.Is(err, kubeletplugin.ErrInvalidDeviceID) {
					t.Fatalf("ParseVirtualDeviceID(%q) = %q, %d, %v; want ErrInvalidDeviceID", tc.id, uuid, i, err)
				}
				return
			}
			if err != nil || uuid != tc.uuid || i != tc.replica {
				t.Fatalf("ParseVirtualDeviceID(%q) = %q, %d, %v; want %q, %d", tc.id, uuid, i, err, tc.uuid, tc.replica)
			}
		})
	}
}

// FuzzParseVirtualDeviceID: every id either fails with ErrInvalidDeviceID or parses into parts
// that VirtualDeviceID puts back together byte for byte; every VirtualDeviceID parses back.
func FuzzParseVirtualDeviceID(f *testing.F) {
	for _, s := range []string{"GPU-a-0", "GPU-0fc1-4c5d-9", "-1", "a-", "a-01", "a--1", "a-1-2"} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, id string, n int) {
		uuid, i, err := kubeletplugin.ParseVirtualDeviceID(id)
		if err != nil {
			if !errors.Is(err, kubeletplugin.ErrInvalidDeviceID) {
				t.Fatalf("ParseVirtualDeviceID(%q): unclassified error %v", id, err)
			}
		} else if back := kubeletplugin.VirtualDeviceID(uuid, i); back != id {
			t.Fatalf("VirtualDeviceID(ParseVirtualDeviceID(%q)) = %q", id, back)
		}
		if id == "" || n < 0 {
			return
		}
		u, j, err := kubeletplugin.ParseVirtualDeviceID(kubeletplugin.VirtualDeviceID(id, n))
		if err != nil || u != id || j != n {
			t.Fatalf("ParseVirtualDeviceID(VirtualDeviceID(%q, %d)) = %q, %d, %v", id, n, u, j, err)
		}
	})
}
