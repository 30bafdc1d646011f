package annotation

import (
	"encoding/json"
	"fmt"
	"testing"
)

// benchDevices returns n realistic devices (an 8×A100 node when n is 8).
func benchDevices(n int) []Device {
	devs := make([]Device, n)
	for i := range devs {
		devs[i] = Device{ID: fmt.Sprintf("GPU-a10000%02d-1111-2222-3333-4444555566%02d", i, i), Index: uint(i), Count: 10,
			Devmem: 81920, Devcore: 100, Type: "NVIDIA A100-SXM4-80GB", Numa: i / 4, Mode: "hami-core", Health: true}
	}
	return devs
}

// BenchmarkEncode compares Encode with the way HAMi encodes (encoding/json on its struct).
func BenchmarkEncode(b *testing.B) {
	for _, n := range []int{1, 8} {
		devs := benchDevices(n)
		b.Run(fmt.Sprintf("%dgpu/hamireg", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Encode(devs)
			}
		})
		b.Run(fmt.Sprintf("%dgpu/encoding-json", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = hamiMarshal(devs, ShapeMaster)
			}
		})
	}
}

// BenchmarkDecode compares Decode with the way HAMi decodes (encoding/json into []*DeviceInfo).
func BenchmarkDecode(b *testing.B) {
	for _, n := range []int{1, 8} {
		value := Encode(benchDevices(n))
		b.Run(fmt.Sprintf("%dgpu/hamireg", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			for b.Loop() {
				if _, err := Decode(value); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%dgpu/encoding-json", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			for b.Loop() {
				var list []*hamiDeviceMaster
				if err := json.Unmarshal([]byte(value), &list); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
