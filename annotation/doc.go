// Package annotation is the codec of HAMi's device-specification annotation: the Node
// annotation hami.io/node-nvidia-register (and its counterparts for other vendors) through which
// a device plugin tells HAMi's scheduler which GPUs a node has.
//
// The value is a compact JSON list of [Device]. The codec is encoding/json over HAMi's own wire
// structs, as HAMi's is, so [Encode] writes it byte for byte as HAMi's node agent does (master's
// shape by default, v2.9.0's with [EncodeShape] and [ShapeV290]) and [Decode] accepts exactly
// what HAMi's scheduler accepts. Writers should sort devices with [SortDevices] first: HAMi
// publishes them in random order and so re-patches the Node almost every cycle on multi-GPU
// nodes, while a canonical order makes an unchanged device set encode to the same bytes.
//
// Decoding never panics and classifies every failure with a sentinel error for errors.Is:
// [ErrAbsent], [ErrMalformed] (with the byte offset, device element, field and cause in a
// [*DecodeError]), [ErrNoDevices] and [ErrInvalidElement] (a null element, on which HAMi's
// scheduler crashes). [Check] answers what HAMi's scheduler concludes for one vendor of one
// node, with the exact message HAMi logs, so that tools can explain a node that does not
// register. [Vendors] lists the register and handshake keys of every vendor HAMi knows;
// [DecodeLegacy] and [EncodeLegacy] handle the colon/comma format HAMi still reads for Hygon
// DCU and Iluvatar.
//
// The topology score annotation hami.io/node-nvidia-score ([KeyNVIDIAScore], NVIDIA only) has
// its own codec: [EncodePairScores] writes it byte for byte as HAMi's device plugin does (a
// compact list in device order, keys sorted, "score":{} for a single GPU), [DecodePairScores]
// reads it as HAMi's scheduler does, and [ScoresByDevice] attaches the entries to the devices
// by UUID. Where HAMi's scheduler drops a node whose score annotation does not decode, the
// readers of this SDK keep it registered without scores ([Check] still reports HAMi's verdict).
//
// Everything here is a pure function of its arguments: no I/O, no logging, no global state,
// safe for concurrent use.
//
// Reading an annotation correctly: HAMi omits zero values, so a device without "index" is
// GPU 0, one without "numa" is on NUMA node 0, and one without "health" is unhealthy.
//
// Usage:
//
//	devs := annotation.Canonical(scanned)
//	value := annotation.Encode(devs) // merge-patch it under annotation.KeyNVIDIARegister
//
//	v := annotation.Check(annotation.NVIDIA(), node.Annotations)
//	if !v.Registers {
//		log.Printf("%s: %v (HAMi logs %q)", node.Name, v.Err, v.HAMiLog)
//	}
package annotation
