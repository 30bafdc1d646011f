package allocation

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/hamireg/hamireg/annotation"
)

// FuzzDecodePodDevices checks, for any value and both versions, that decoding never panics,
// that every error is ErrMalformed through a *DecodeError, that what decodes encodes to a value
// that decodes to the same devices (and encodes to itself), and that consuming an entry never
// lengthens the value.
func FuzzDecodePodDevices(f *testing.F) {
	for _, s := range []string{
		"GPU-0a1b2c3d-0000-1111-2222-333344445555,NVIDIA,3000,30:;", ";GPU-b,NVIDIA,3000,0:;", "a,NVIDIA,1,1:b,NVIDIA,2,2:;;", "",
		";;;;", "garbage", "x,y,z:;", "a,b,99999999999,-1:;", " a, b, 1, 2:", ",,0,0:;", "a[1-3],NVIDIA,5120,14:;", "::;:,:;",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		for _, v := range []Version{VersionMaster, VersionV290} {
			pd, err := DecodePodDevices(value, v)
			if err != nil {
				var de *DecodeError
				if !errors.Is(err, ErrMalformed) || !errors.As(err, &de) || pd != nil {
					t.Fatalf("%v: %q: %v, %v", v, value, pd, err)
				}
				continue
			}
			enc := EncodePodDevices(pd)
			back, err := DecodePodDevices(enc, v)
			if err != nil {
				t.Fatalf("%v: decode own encoding %q of %q: %v", v, enc, value, err)
			}
			if diff := cmp.Diff(pd, back, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("%v: %q round trip (-first +second):\n%s", v, value, diff)
			}
			if again := EncodePodDevices(back); again != enc {
				t.Fatalf("%v: encoding not stable: %q then %q", v, enc, again)
			}
			if i, ok := pd.Next(); ok && len(EncodePodDevices(pd.Consume(i))) > len(enc) {
				t.Fatalf("%v: consuming entry %d of %q lengthens it", v, i, enc)
			}
		}
	})
}

// FuzzFit places arbitrary requests on arbitrary GPUs and checks what a scheduler must never
// do: hand out more slots, memory or cores than a GPU has, a GPU that is unhealthy, or a
// number of GPUs other than asked for.
func FuzzFit(f *testing.F) {
	f.Add(uint8(2), int32(10), int32(23028), int32(100), int64(3), int64(8000), int64(30), uint8(1), int32(2), int32(3000), int32(101), int32(30), uint8(1), false, "spread")
	f.Add(uint8(8), int32(1), int32(0), int32(0), int64(0), int64(0), int64(0), uint8(2), int32(8), int32(0), int32(50), int32(100), uint8(0), true, "binpack")
	f.Fuzz(func(t *testing.T, ngpu uint8, count, devmem, devcore int32, used, usedmem, usedcores int64, nctr uint8, nums, mem, pct, cores int32, unhealthy uint8, numa bool, policy string) {
		devs := make([]annotation.Device, int(ngpu%9))
		usage := map[string]Usage{}
		for i := range devs {
			devs[i] = annotation.Device{ID: string(rune('a' + i)), Count: count, Devmem: devmem, Devcore: devcore, Type: "NVIDIA A10", Numa: i % 2, Health: i != int(unhealthy)}
			if i%2 == 0 {
				usage[devs[i].ID] = Usage{Used: used, Usedmem: usedmem, Usedcores: usedcores}
			}
		}
		req := PodRequest{Init: int(nctr % 2)}
		for range int(nctr % 4) {
			req.Containers = append(req.Containers, Request{Count: nums % 10, Type: "NVIDIA", Memory: mem, MemoryPercentage: pct, Cores: cores})
		}
		pod := map[string]string{KeyGPUSchedulerPolicy: policy}
		if numa {
			pod[KeyNUMABind] = "true"
		}
		for _, v := range []Version{VersionMaster, VersionV290} {
			pd, reason, ok := Fit(WithUsage(devs, usage), req, pod, nil, Config{Version: v})
			if !ok {
				if reason == "" {
					t.Fatalf("%v: no fit without a reason", v)
				}
				continue
			}
			if len(pd) != len(req.Containers) {
				t.Fatalf("%v: %d entries for %d containers", v, len(pd), len(req.Containers))
			}
			for i, c := range pd {
				if want := max(req.Containers[i].Count, 0); int32(len(c)) != want {
					t.Fatalf("%v: container %d got %d GPUs, asked %d", v, i, len(c), want)
				}
			}
			// Regular containers add up on a GPU; each init container must fit alone (master)
			// or with them (v2.9.0).
			var together PodDevices
			for i, c := range pd {
				if v == VersionMaster && i < req.Init {
					checkFits(t, devs, usage, PodDevices{c})
					continue
				}
				together = append(together, c)
			}
			checkFits(t, devs, usage, together)
		}
	})
}

// checkFits fails if pd takes more of a GPU than it has free, or takes an unhealthy one.
func checkFits(t *testing.T, devs []annotation.Device, usage map[string]Usage, pd PodDevices) {
	t.Helper()
	for gpu, u := range pd.Usage() {
		i := -1
		for j := range devs {
			if devs[j].ID == gpu {
				i = j
			}
		}
		if i < 0 || !devs[i].Health {
			t.Fatalf("took GPU %q, unknown or unhealthy", gpu)
		}
		d, have := devs[i], usage[gpu]
		if have.Used+u.Used > int64(d.Count) || have.Usedmem+u.Usedmem > int64(d.Devmem) || have.Usedcores+u.Usedcores > int64(d.Devcore) {
			t.Fatalf("GPU %s over-committed: has %+v of %+v, pod adds %+v", gpu, have, d, u)
		}
	}
}
