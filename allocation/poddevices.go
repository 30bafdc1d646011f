package allocation

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ContainerDevice is one device of one container's share, as HAMi's scheduler writes it.
type ContainerDevice struct {
	// UUID is the GPU's UUID; a v2.9.0 MIG instance carries a "[template-position]" suffix.
	UUID string
	// Type is the vendor word ("NVIDIA"), not the GPU model.
	Type string
	// Usedmem is the device memory in MiB the container may use on this GPU.
	Usedmem int32
	// Usedcores is the percentage of the GPU's cores the container may use.
	Usedcores int32
	// MIG is the device's MIG reservation on a GPU in [ModeMIG] (HAMi master); zero for any
	// other device. It is not part of the device list: [EncodePodDevices] leaves it out and
	// [DecodePodDevices] leaves it zero; it travels in mig.KeyAllocations ([MIGAllocations],
	// [WithMIG]).
	MIG MIGSlot
}

// GPU returns the physical GPU's UUID: UUID without a MIG suffix "[…]".
func (d ContainerDevice) GPU() string {
	id, _, _ := strings.Cut(d.UUID, "[")
	return id
}

// ContainerDevices is one container's devices; empty for a container without any.
type ContainerDevices []ContainerDevice

// PodDevices is one vendor's devices of a pod: one entry per container, init containers first,
// then the regular containers, in the order of the pod spec.
type PodDevices []ContainerDevices

// Next returns the index of the first entry that still lists devices: the container the device
// plugin serves next.
func (pd PodDevices) Next() (int, bool) {
	for i, c := range pd {
		if len(c) > 0 {
			return i, true
		}
	}
	return -1, false
}

// Consume returns a copy of pd with entry i emptied: what the device plugin writes back after
// serving container i. Encoded, it is never longer than pd (HAMi's plugin adds a ';' each
// time). pd itself is not modified; an index out of range returns an unchanged copy.
func (pd PodDevices) Consume(i int) PodDevices {
	out := make(PodDevices, len(pd))
	copy(out, pd)
	if i >= 0 && i < len(out) {
		out[i] = ContainerDevices{}
	}
	return out
}

// EncodePodDevices returns the annotation value HAMi writes for pd, byte for byte: each device
// as "uuid,type,usedmem,usedcores:" and each container entry closed by ';', including entries
// without devices. Nothing is escaped, as in HAMi: a ',', ':' or ';' inside a UUID or type
// corrupts the value.
func EncodePodDevices(pd PodDevices) string {
	var b strings.Builder
	for _, c := range pd {
		for _, d := range c {
			b.WriteString(d.UUID)
			b.WriteByte(',')
			b.WriteString(d.Type)
			b.WriteByte(',')
			b.WriteString(strconv.FormatInt(int64(d.Usedmem), 10))
			b.WriteByte(',')
			b.WriteString(strconv.FormatInt(int64(d.Usedcores), 10))
			b.WriteByte(':')
		}
		b.WriteByte(';')
	}
	return b.String()
}

// DecodePodDevices reads a pod device list the way HAMi's DecodePodDevices does: entries are
// separated by ';', devices by ':', and a device needs at least four comma-separated fields
// (uuid, type, memory, cores; more are ignored, nothing is trimmed). Pieces between ':' without
// a comma are skipped. With [VersionV290] a memory or core value that does not parse is 0 and
// one out of int32's range is clamped; with [VersionMaster] it is an error.
//
// The empty piece after the last ';' is not an entry: every entry ends with ';', so decoding
// and encoding again gives the same value (HAMi appends an empty entry per round trip). A
// value without a final ';' is read all the same, and "" has no entries.
//
// Errors are a [*DecodeError] wrapping [ErrMalformed]; DecodePodDevices never panics.
func DecodePodDevices(value string, v Version) (PodDevices, error) {
	if value == "" {
		return PodDevices{}, nil
	}
	pieces := strings.Split(value, ";")
	if pieces[len(pieces)-1] == "" {
		pieces = pieces[:len(pieces)-1]
	}
	pd := make(PodDevices, len(pieces))
	for ci, piece := range pieces {
		c := ContainerDevices{}
		for sub := range strings.SplitSeq(piece, ":") {
			if !strings.Contains(sub, ",") {
				continue
			}
			d, err := decodeDevice(sub, v)
			if err != nil {
				err.Container, err.Device = ci, len(c)
				return nil, err
			}
			c = append(c, d)
		}
		pd[ci] = c
	}
	return pd, nil
}

func decodeDevice(s string, v Version) (ContainerDevice, *DecodeError) {
	f := strings.Split(s, ",")
	if len(f) < 4 {
		msg := "pod annotation format error, missing fields, do not use nodeName in task spec"
		if v == VersionV290 {
			msg = "pod annotation format error; information missing, please do not use nodeName field in task"
		}
		return ContainerDevice{}, &DecodeError{Msg: fmt.Sprintf("%s: %d of 4 fields in %q", msg, len(f), s)}
	}
	mem, err := parseInt32(f[2], v)
	if err != nil {
		return ContainerDevice{}, &DecodeError{Field: "memory", Msg: "invalid memory field: " + err.Error()}
	}
	cores, err := parseInt32(f[3], v)
	if err != nil {
		return ContainerDevice{}, &DecodeError{Field: "cores", Msg: "invalid core field: " + err.Error()}
	}
	return ContainerDevice{UUID: f[0], Type: f[1], Usedmem: mem, Usedcores: cores}, nil
}

// parseInt32 parses a decimal int32. HAMi v2.9.0 ignores the error: strconv gives 0 for bad
// syntax and the clamped value for a range error, which is what it then uses.
func parseInt32(s string, v Version) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil && v != VersionV290 {
		return 0, err
	}
	return int32(n), nil
}

// ContainerAt returns the container of pod that entry i of its device list belongs to: init
// containers first, then the regular ones.
func ContainerAt(pod *corev1.Pod, i int) (*corev1.Container, bool) {
	switch n := len(pod.Spec.InitContainers); {
	case i < 0:
		return nil, false
	case i < n:
		return &pod.Spec.InitContainers[i], true
	case i-n < len(pod.Spec.Containers):
		return &pod.Spec.Containers[i-n], true
	}
	return nil, false
}
