package annotation_test

import (
	"errors"
	"fmt"

	"github.com/hamireg/hamireg/annotation"
)

func ExampleEncode() {
	devs := []annotation.Device{
		{ID: "GPU-b", Index: 1, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Numa: 1, Mode: "hami-core", Health: true},
		{ID: "GPU-a", Index: 0, Count: 10, Devmem: 23028, Devcore: 100, Type: "NVIDIA A10", Mode: "hami-core", Health: false},
	}
	annotation.SortDevices(devs) // canonical order: an unchanged node always encodes the same
	fmt.Println(annotation.Encode(devs))
	fmt.Println(annotation.EncodeShape(devs[:1], annotation.ShapeV290))
	// Output:
	// [{"id":"GPU-a","count":10,"devmem":23028,"devcore":100,"type":"NVIDIA A10","mode":"hami-core"},{"id":"GPU-b","index":1,"count":10,"devmem":23028,"devcore":100,"type":"NVIDIA A10","numa":1,"mode":"hami-core","health":true}]
	// [{"id":"GPU-a","count":10,"devmem":23028,"devcore":100,"type":"NVIDIA A10","mode":"hami-core","devicepairscore":{}}]
}

func ExampleDecode() {
	devs, err := annotation.Decode(`[{"ID":"GPU-a","devmem":1024,"count":10,"health":true,"unknown":1}]`)
	fmt.Println(devs[0].ID, devs[0].Devmem, devs[0].Health, err)

	_, err = annotation.Decode(`[{"id":"GPU-a","devmem":1024.5}]`)
	fmt.Println(errors.Is(err, annotation.ErrMalformed))
	fmt.Println(err)

	_, err = annotation.Decode(`[null]`)
	fmt.Println(errors.Is(err, annotation.ErrInvalidElement))
	// Output:
	// GPU-a 1024 true <nil>
	// true
	// decode register annotation: annotation malformed at offset 24 (device 0, field "devmem"): number 1024.5 is not an int32
	// true
}

func ExampleCheck() {
	for _, value := range []string{
		`[{"id":"GPU-a","count":10,"health":true}]`,
		`[]`,
		`[{"id":"GPU-a","count":10,`,
	} {
		v := annotation.Check(annotation.NVIDIA(), map[string]string{annotation.KeyNVIDIARegister: value})
		fmt.Printf("registers=%v hamiLog=%q\n", v.Registers, v.HAMiLog)
	}
	v := annotation.Check(annotation.NVIDIA(), nil)
	fmt.Println(errors.Is(v.Err, annotation.ErrAbsent), v.HAMiLog)
	// Output:
	// registers=true hamiLog=""
	// registers=false hamiLog="no nvidia gpu device found"
	// registers=false hamiLog="failed to decode node devices"
	// true Failed to get node devices
}

// A vendor HAMi does not know gets HAMi's key conventions from its name; Validate says what a
// part still needs.
func ExampleNewVendor() {
	acme := annotation.NewVendor("ACME", "acme.example/npu")
	fmt.Println(acme.RegisterKey, acme.ToAllocateKey, acme.SocketName())
	fmt.Println(acme.Validate(annotation.PartNodeAgent))

	acme.ResourceName = ""
	err := acme.Validate(annotation.PartKubelet)
	fmt.Println(errors.Is(err, annotation.ErrIncompleteVendor))
	fmt.Println(err)
	// Output:
	// hami.io/node-acme-register hami.io/acme-devices-to-allocate hamireg-acme-npu.sock
	// <nil>
	// true
	// vendor ACME lacks what the kubelet part needs: ResourceName (the extended resource the kubelet counts, e.g. "nvidia.com/gpu"): incomplete vendor
}

// ExampleEncodePairScores writes the topology score annotation as HAMi's device plugin does and
// reads it back as HAMi's scheduler does; ScoresByDevice attaches the entries to the devices.
func ExampleEncodePairScores() {
	value := annotation.EncodePairScores([]annotation.PairScore{
		{UUID: "GPU-a", Scores: map[string]int{"GPU-b": 420}},
		{UUID: "GPU-b", Scores: map[string]int{"GPU-a": 420}},
	})
	fmt.Println(value) // merge-patch it under annotation.KeyNVIDIAScore
	fmt.Println(annotation.EncodePairScores([]annotation.PairScore{{UUID: "GPU-a"}}))

	scores, err := annotation.DecodePairScores(value)
	devs := []annotation.Device{{ID: "GPU-b"}, {ID: "GPU-a"}}
	fmt.Println(annotation.ScoresByDevice(devs, scores), err)

	_, err = annotation.DecodePairScores(`[{"uuid":"GPU-a","score":{"GPU-b":"high"}}]`)
	fmt.Println(errors.Is(err, annotation.ErrMalformed))
	// Output:
	// [{"uuid":"GPU-a","score":{"GPU-b":420}},{"uuid":"GPU-b","score":{"GPU-a":420}}]
	// [{"uuid":"GPU-a","score":{}}]
	// [map[GPU-a:420] map[GPU-b:420]] <nil>
	// true
}
