package nodelock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/nodelock"
)

// The key is HAMi's.
func TestKey(t *testing.T) {
	t.Parallel()
	if nodelock.Key != "hami.io/mutex.lock" {
		t.Errorf("Key = %q", nodelock.Key)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 19, 9, 14, 52, 0, time.UTC)
	tests := map[string]struct {
		value      string
		want       nodelock.Lock
		wantReason string // part of the error message; "" means no error
	}{
		"with pod":              {value: "2026-05-19T09:14:52Z,default,gpu-pod", want: nodelock.Lock{Time: at, Namespace: "default", Name: "gpu-pod"}},
		"offset zone to UTC":    {value: "2026-05-19T11:14:52+02:00,kube-system,p", want: nodelock.Lock{Time: at, Namespace: "kube-system", Name: "p"}},
		"fractional seconds":    {value: "2026-05-19T09:14:52.25Z,a,b", want: nodelock.Lock{Time: at.Add(250 * time.Millisecond), Namespace: "a", Name: "b"}},
		"legacy time only":      {value: "2026-05-19T09:14:52Z", want: nodelock.Lock{Time: at}},
		"empty parts":           {value: "2026-05-19T09:14:52Z,,", want: nodelock.Lock{Time: at}},
		"spaces kept as HAMi":   {value: "2026-05-19T09:14:52Z, default ,p", want: nodelock.Lock{Time: at, Namespace: " default ", Name: "p"}},
		"two parts":             {value: "2026-05-19T09:14:52Z,default", wantReason: "expected 3 parts, got 2"},
		"four parts":            {value: "2026-05-19T09:14:52Z,a,b,c", wantReason: "expected 3 parts, got 4"},
		"bad time":              {value: "yesterday,default,gpu-pod", wantReason: `time "yesterday" is not RFC 3339`},
		"empty":                 {value: "", wantReason: `time "" is not RFC 3339`},
		"handshake layout":      {value: "2026-05-19 09:14:52", wantReason: "is not RFC 3339"},
		"only commas":           {value: ",,", wantReason: `time "" is not RFC 3339`},
		"time without the zone": {value: "2026-05-19T09:14:52,default,p", wantReason: "is not RFC 3339"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := nodelock.Parse(tc.value)
			if tc.wantReason == "" {
				if err != nil {
					t.Fatalf("Parse(%q): %v", tc.value, err)
				}
				if d := cmp.Diff(tc.want, got); d != "" {
					t.Errorf("Parse(%q) (-want +got):\n%s", tc.value, d)
				}
				return
			}
			var me *nodelock.MalformedError
			if !errors.Is(err, nodelock.ErrMalformed) || !errors.As(err, &me) {
				t.Fatalf("Parse(%q) = %+v, %v; want a *MalformedError", tc.value, got, err)
			}
			if me.Value != tc.value || !strings.Contains(err.Error(), tc.wantReason) || !strings.Contains(err.Error(), tc.value) {
				t.Errorf("error %q: want the value %q and %q in it", err, tc.value, tc.wantReason)
			}
			if got != (nodelock.Lock{}) {
				t.Errorf("Parse returned %+v with its error, want the zero Lock", got)
			}
		})
	}
}

func TestLockString(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 19, 9, 14, 52, 0, time.UTC)
	tests := map[string]struct {
		lock nodelock.Lock
		want string
	}{
		"with pod":      {lock: nodelock.Lock{Time: at, Namespace: "default", Name: "gpu-pod"}, want: "2026-05-19T09:14:52Z,default,gpu-pod"},
		"legacy":        {lock: nodelock.Lock{Time: at}, want: "2026-05-19T09:14:52Z"},
		"other zone":    {lock: nodelock.Lock{Time: at.In(time.FixedZone("CST", 8*3600)), Namespace: "a", Name: "b"}, want: "2026-05-19T09:14:52Z,a,b"},
		"fraction kept": {lock: nodelock.Lock{Time: at.Add(time.Millisecond)}, want: "2026-05-19T09:14:52.001Z"},
		"new lock":      {lock: nodelock.NewLock(at.Add(999*time.Millisecond).In(time.Local), types.NamespacedName{Namespace: "ns", Name: "p"}), want: "2026-05-19T09:14:52Z,ns,p"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := tc.lock.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			back, err := nodelock.Parse(tc.lock.String())
			if err != nil || !back.Time.Equal(tc.lock.Time) || back.Namespace != tc.lock.Namespace || back.Name != tc.lock.Name {
				t.Errorf("Parse(String()) = %+v, %v; want %+v", back, err, tc.lock)
			}
		})
	}
}

func TestOwner(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		lock      nodelock.Lock
		want      types.NamespacedName
		wantNamed bool
	}{
		"pod":            {lock: nodelock.Lock{Namespace: "a", Name: "b"}, want: types.NamespacedName{Namespace: "a", Name: "b"}, wantNamed: true},
		"legacy":         {lock: nodelock.Lock{}},
		"namespace only": {lock: nodelock.Lock{Namespace: "a"}},
		"name only":      {lock: nodelock.Lock{Name: "b"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, named := tc.lock.Owner()
			if got != tc.want || named != tc.wantNamed {
				t.Errorf("Owner() = %v, %v; want %v, %v", got, named, tc.want, tc.wantNamed)
			}
		})
	}
}

func TestFromAnnotations(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		annotations map[string]string
		want        nodelock.Lock
		wantPresent bool
		wantErr     error
	}{
		"absent":    {annotations: map[string]string{"other": "x"}},
		"nil map":   {},
		"present":   {annotations: map[string]string{nodelock.Key: "2026-05-19T09:14:52Z,default,p"}, want: nodelock.Lock{Time: time.Date(2026, 5, 19, 9, 14, 52, 0, time.UTC), Namespace: "default", Name: "p"}, wantPresent: true},
		"malformed": {annotations: map[string]string{nodelock.Key: "not-a-time,default"}, wantPresent: true, wantErr: nodelock.ErrMalformed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, present, err := nodelock.FromAnnotations(tc.annotations)
			if got != tc.want || present != tc.wantPresent || !errors.Is(err, tc.wantErr) {
				t.Errorf("FromAnnotations = %+v, %v, %v; want %+v, %v, %v", got, present, err, tc.want, tc.wantPresent, tc.wantErr)
			}
		})
	}
}
