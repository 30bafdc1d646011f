package allocation

import (
	"errors"
	"math"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hamireg/hamireg/annotation"
)

func rq(name string, hard map[string]string) *corev1.ResourceQuota {
	out := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}}}
	for k, v := range hard {
		out.Spec.Hard[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return out
}

func TestQuotaLimitsFrom(t *testing.T) {
	t.Parallel()
	type warn struct {
		key string
		err error
	}
	tests := map[string]struct {
		quotas []*corev1.ResourceQuota
		ver    Version
		want   QuotaLimits
		warns  []warn
	}{
		"managed keys": {
			quotas: []*corev1.ResourceQuota{rq("q", map[string]string{"limits.nvidia.com/gpumem": "4000", "limits.nvidia.com/gpucores": "50", "cpu": "4"})},
			want:   QuotaLimits{Memory: QuotaLimit{Value: 4000, Set: true, Quota: "q"}, Cores: QuotaLimit{Value: 50, Set: true, Quota: "q"}},
		},
		"suffix applied": {
			quotas: []*corev1.ResourceQuota{rq("q", map[string]string{"limits.nvidia.com/gpumem": "4k"})},
			want:   QuotaLimits{Memory: QuotaLimit{Value: 4000, Set: true, Quota: "q"}},
		},
		"binary suffix warned": {
			quotas: []*corev1.ResourceQuota{rq("q", map[string]string{"limits.nvidia.com/gpumem": "10Gi"})},
			want:   QuotaLimits{Memory: QuotaLimit{Value: 10 << 30, Set: true, Quota: "q"}},
			warns:  []warn{{"limits.nvidia.com/gpumem", ErrQuotaValueSuffix}},
		},
		"two objects: the tightest, in any order": {
			quotas: []*corev1.ResourceQuota{rq("small", map[string]string{"limits.nvidia.com/gpumem": "3000"}), rq("big", map[string]string{"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "40"})},
			want:   QuotaLimits{Memory: QuotaLimit{Value: 3000, Set: true, Quota: "small"}, Cores: QuotaLimit{Value: 40, Set: true, Quota: "big"}},
		},
		"fractional: integer part": {
			quotas: []*corev1.ResourceQuota{rq("q", map[string]string{"limits.nvidia.com/gpumem": "1500.5"})},
			want:   QuotaLimits{Memory: QuotaLimit{Value: 1500, Set: true, Quota: "q"}},
			warns:  []warn{{"limits.nvidia.com/gpumem", ErrQuotaValueFractional}},
		},
		"fractional below 1 blocks": {
			quotas: []*corev1.ResourceQuota{rq("q", map[string]string{"limits.nvidia.com/gpucores": "500m"})},
			want:   QuotaLimits{Cores: QuotaLimit{Value: 0, Set: true, Quota: "q"}},
			warns:  []warn{{"limits.nvidia.com/gpucores", ErrQuotaValueFractional}},
		},
		"huge saturates": {
			quotas: []*corev1.ResourceQuota{rq("q", map[string]string{"limits.nvidia.com/gpucores": "100E"})},
			want:   QuotaLimits{Cores: QuotaLimit{Value: math.MaxInt64, Set: true, Quota: "q"}},
		},
		"v2.9.0: a zero limits nothing and loses to any other": {
			quotas: []*corev1.ResourceQuota{rq("a", map[string]string{"limits.nvidia.com/gpumem": "0"}), rq("b", map[string]string{"limits.nvidia.com/gpumem": "3000"})},
			ver:    VersionV290,
			want:   QuotaLimits{Memory: QuotaLimit{Value: 3000, Set: true, Quota: "b"}},
		},
		"master: a zero is the tightest": {
			quotas: []*corev1.ResourceQuota{rq("a", map[string]string{"limits.nvidia.com/gpumem": "0"}), rq("b", map[string]string{"limits.nvidia.com/gpumem": "3000"})},
			want:   QuotaLimits{Memory: QuotaLimit{Value: 0, Set: true, Quota: "a"}},
		},
		"ignored keys warned": {
			quotas: []*corev1.ResourceQuota{rq("q", map[string]string{"limits.nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "requests.nvidia.com/gpumem": "1000",
				"requests.nvidia.com/gpucores": "10", "limits.nvidia.com/gpumem-percentage": "50", "requests.nvidia.com/gpu": "2", "requests.cpu": "1"}), nil},
			warns: []warn{{"limits.nvidia.com/gpu", ErrQuotaKeyIgnored}, {"limits.nvidia.com/gpumem-percentage", ErrQuotaKeyIgnored}, {"nvidia.com/gpumem", ErrQuotaKeyIgnored},
				{"requests.nvidia.com/gpucores", ErrQuotaKeyIgnored}, {"requests.nvidia.com/gpumem", ErrQuotaKeyIgnored}},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, warns := QuotaLimitsFrom(tt.quotas, Config{Version: tt.ver})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
			var gotWarns []warn
			for _, w := range warns {
				if !errors.Is(w, w.Err) || w.Hint == "" || w.Quota == "" {
					t.Errorf("warning %v: class, hint or object missing", w)
				}
				gotWarns = append(gotWarns, warn{w.Key, w.Err})
			}
			if diff := cmp.Diff(tt.warns, gotWarns, cmp.AllowUnexported(warn{}), cmp.Comparer(errors.Is)); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQuotaUsage(t *testing.T) {
	t.Parallel()
	d := func(gpu string, mem, cores int32) ContainerDevice {
		return ContainerDevice{UUID: gpu, Type: annotation.VendorNVIDIA, Usedmem: mem, Usedcores: cores}
	}
	pd := PodDevices{{d("a", 3000, 10)}, {d("a", 1000, 10), d("b", 500, 5)}, {d("a", 1000, 10)}}
	tests := map[string]struct {
		init int
		ver  Version
		want QuotaAmount
	}{
		"v2.9.0 sums init containers": {init: 1, ver: VersionV290, want: QuotaAmount{Memory: 5500, Cores: 35}},
		"master: per GPU peak":        {init: 1, ver: VersionMaster, want: QuotaAmount{Memory: 3500, Cores: 25}},
		"master without init":         {init: 0, ver: VersionMaster, want: QuotaAmount{Memory: 5500, Cores: 35}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := QuotaUsage(pd, tt.init, tt.ver); got != tt.want {
				t.Errorf("QuotaUsage = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestFitWithQuota(t *testing.T) {
	t.Parallel()
	devs := WithUsage([]annotation.Device{
		{ID: "g0", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true},
		{ID: "g1", Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: true},
	}, nil)
	mem := func(limit int64) *Quota {
		return &Quota{Limits: QuotaLimits{Memory: QuotaLimit{Value: limit, Set: true, Quota: "q"}}, Used: QuotaAmount{Memory: 1000}}
	}
	one := Request{Count: 1, Type: annotation.VendorNVIDIA, Memory: 3000, MemoryPercentage: PercentageUnset}
	tests := map[string]struct {
		req    PodRequest
		quota  *Quota
		ver    Version
		factor int32
		reason string
	}{
		"at the limit fits":          {req: PodRequest{Containers: []Request{one}}, quota: mem(4000)},
		"one MiB over":               {req: PodRequest{Containers: []Request{one}}, quota: mem(3999), reason: "2/2 ResourceQuotaNotFit"},
		"no quota":                   {req: PodRequest{Containers: []Request{one}}},
		"limit of 0, v2.9.0: none":   {req: PodRequest{Containers: []Request{one}}, quota: mem(0), ver: VersionV290},
		"limit of 0, master: blocks": {req: PodRequest{Containers: []Request{one}}, quota: mem(0), reason: "2/2 ResourceQuotaNotFit"},
		"second GPU of a container over": {req: PodRequest{Containers: []Request{{Count: 2, Type: annotation.VendorNVIDIA, Memory: 2000, MemoryPercentage: PercentageUnset}}},
			quota: mem(4000), reason: "1/2 AllocatedCardsInsufficientRequest, 1/2 ResourceQuotaNotFit"},
		"earlier container counts": {req: PodRequest{Containers: []Request{one, one}}, quota: mem(6000), reason: "2/2 ResourceQuotaNotFit"},
		"percentage resolved per GPU": {req: PodRequest{Containers: []Request{{Count: 1, Type: annotation.VendorNVIDIA, MemoryPercentage: 50}}},
			quota: mem(12514)},
		"percentage over": {req: PodRequest{Containers: []Request{{Count: 1, Type: annotation.VendorNVIDIA, MemoryPercentage: 50}}},
			quota: mem(12513), reason: "2/2 ResourceQuotaNotFit"},
		"memory factor scales the limit": {req: PodRequest{Containers: []Request{{Count: 1, Type: annotation.VendorNVIDIA, Memory: 3072, MemoryPercentage: PercentageUnset}}},
			quota: &Quota{Limits: QuotaLimits{Memory: QuotaLimit{Value: 4, Set: true}}, Used: QuotaAmount{Memory: 1024}}, factor: 1024},
		"init container, master: peak": {req: PodRequest{Init: 1, Containers: []Request{one, one}}, quota: mem(4000)},
		"init container, v2.9.0: sum":  {req: PodRequest{Init: 1, Containers: []Request{one, one}}, quota: mem(4000), ver: VersionV290, reason: "2/2 ResourceQuotaNotFit"},
		"cores": {req: PodRequest{Containers: []Request{{Count: 1, Type: annotation.VendorNVIDIA, Memory: 1, MemoryPercentage: PercentageUnset, Cores: 30}}},
			quota: &Quota{Limits: QuotaLimits{Cores: QuotaLimit{Value: 50, Set: true}}, Used: QuotaAmount{Cores: 30}}, reason: "2/2 ResourceQuotaNotFit"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := Config{Version: tt.ver, MemoryFactor: tt.factor}
			_, reason, ok := FitWith(devs, tt.req, nil, nil, c, FitOptions{Quota: tt.quota})
			if reason != tt.reason || ok != (tt.reason == "") {
				t.Errorf("FitWith = %q, %v; want %q", reason, ok, tt.reason)
			}
			d := ScheduleWith([]Node{{Name: "n", Devices: devs}}, tt.req, nil, c, FitOptions{Quota: tt.quota})
			if (d.Node == "") != (tt.reason != "") || d.Failed["n"] != tt.reason {
				t.Errorf("ScheduleWith = %+v, want reason %q", d, tt.reason)
			}
		})
	}
}

func TestAdmissionQuotaAsk(t *testing.T) {
	t.Parallel()
	ctr := func(limits map[string]string) corev1.Container {
		rl := corev1.ResourceList{}
		for k, v := range limits {
			rl[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		return corev1.Container{Resources: corev1.ResourceRequirements{Limits: rl}}
	}
	two := ctr(map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "10"})
	one := ctr(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "10"})
	pct := ctr(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})
	tests := map[string]struct {
		pod  corev1.PodSpec
		ver  Version
		want QuotaAmount
	}{
		"v2.9.0: only count 1":          {pod: corev1.PodSpec{Containers: []corev1.Container{two, one}}, ver: VersionV290, want: QuotaAmount{Memory: 3000, Cores: 10}},
		"master: memory × count":        {pod: corev1.PodSpec{Containers: []corev1.Container{two, one}}, want: QuotaAmount{Memory: 11000, Cores: 30}},
		"master: init as max":           {pod: corev1.PodSpec{InitContainers: []corev1.Container{one}, Containers: []corev1.Container{one}}, want: QuotaAmount{Memory: 3000, Cores: 10}},
		"v2.9.0: init ignored":          {pod: corev1.PodSpec{InitContainers: []corev1.Container{two}, Containers: []corev1.Container{one}}, ver: VersionV290, want: QuotaAmount{Memory: 3000, Cores: 10}},
		"percentage counts 0":           {pod: corev1.PodSpec{Containers: []corev1.Container{pct}}},
		"percentage counts 0 in v2.9.0": {pod: corev1.PodSpec{Containers: []corev1.Container{pct}}, ver: VersionV290},
		"no GPU container counts 0":     {pod: corev1.PodSpec{Containers: []corev1.Container{ctr(map[string]string{"cpu": "1"})}}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := AdmissionQuotaAsk(&corev1.Pod{Spec: tt.pod}, Config{Version: tt.ver}); got != tt.want {
				t.Errorf("AdmissionQuotaAsk = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// FuzzQuotaLimitsFrom reads arbitrary keys and values: never a panic, a limit is never
// negative, every warning is classified, and the limit read from two objects is the tighter of
// the limits read from each.
var hugeExponent = regexp.MustCompile(`[eE][+-]?[0-9]{4,}`)

func FuzzQuotaLimitsFrom(f *testing.F) {
	for _, s := range [][2]string{{"limits.nvidia.com/gpumem", "4000"}, {"limits.nvidia.com/gpucores", "1.5"}, {"limits.nvidia.com/gpumem", "10Gi"},
		{"requests.nvidia.com/gpumem", "1"}, {"limits.nvidia.com/gpumem", "-1"}, {"limits.nvidia.com/gpumem", "9e18"}, {"limits.nvidia.com/gpucores", "1m"}} {
		f.Add(s[0], s[1], "2000", false)
	}
	f.Fuzz(func(t *testing.T, key, value, other string, v290 bool) {
		// apimachinery's ParseQuantity takes minutes on an exponent of many digits
		// ("e1111111128"); the API server parses a ResourceQuota before any informer sees it,
		// so such values never reach QuotaLimitsFrom, and the fuzzer does not feed them.
		if hugeExponent.MatchString(value) || hugeExponent.MatchString(other) {
			return
		}
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return
		}
		o, err := resource.ParseQuantity(other)
		if err != nil {
			return
		}
		c := Config{}
		if v290 {
			c.Version = VersionV290
		}
		a := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceName(key): q}}}
		b := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceName(key): o}}}
		la, wa := QuotaLimitsFrom([]*corev1.ResourceQuota{a}, c)
		lb, _ := QuotaLimitsFrom([]*corev1.ResourceQuota{b}, c)
		both, _ := QuotaLimitsFrom([]*corev1.ResourceQuota{b, a}, c)
		for _, w := range wa {
			if !errors.Is(w, ErrQuotaKeyIgnored) && !errors.Is(w, ErrQuotaValueFractional) && !errors.Is(w, ErrQuotaValueSuffix) && !errors.Is(w, ErrQuotaValueNegative) {
				t.Fatalf("unclassified warning %v", w)
			}
		}
		for _, l := range []QuotaLimit{la.Memory, la.Cores, both.Memory, both.Cores} {
			if l.Value < 0 {
				t.Fatalf("negative limit %+v from %s=%s", l, key, value)
			}
		}
		pick := func(x, y QuotaLimit) int64 {
			switch {
			case !x.Set:
				return y.Value
			case !y.Set:
				return x.Value
			case v290 && x.Value == 0:
				return y.Value
			case v290 && y.Value == 0:
				return x.Value
			}
			return min(x.Value, y.Value)
		}
		if got, want := both.Memory.Value, pick(la.Memory, lb.Memory); got != want {
			t.Fatalf("memory of both %d, want %d (%+v, %+v)", got, want, la.Memory, lb.Memory)
		}
		if got, want := both.Cores.Value, pick(la.Cores, lb.Cores); got != want {
			t.Fatalf("cores of both %d, want %d", got, want)
		}
	})
}
