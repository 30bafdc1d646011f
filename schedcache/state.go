package schedcache

import (
	"iter"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hamireg/hamireg/annotation"
)

// State is the registration state of one vendor on one node.
type State int

const (
	// StateRegistered means the devices decoded and the handshake allows the node: a scheduler
	// may place work on its devices.
	StateRegistered State = iota
	// StateAbsent means the node has no register annotation for the vendor (HAMi logs
	// "Failed to get node devices" at V(5)). Err is annotation.ErrAbsent.
	StateAbsent
	// StateMalformed means the annotation does not decode (HAMi logs
	// "failed to decode node devices"). Err is annotation.ErrMalformed.
	StateMalformed
	// StateNoDevices means the annotation lists no devices, "[]" or "null" (HAMi logs
	// "no nvidia gpu device found"). Err is annotation.ErrNoDevices.
	StateNoDevices
	// StateInvalidElement means the list holds a null element, on which HAMi's extender
	// crashes. Err is annotation.ErrInvalidElement.
	StateInvalidElement
	// StateUnhealthy means the devices decode but the handshake decision says the node is gone
	// (handshake expired with allocatable 0, or allocatable dropped to 0). Err is [ErrUnhealthy].
	StateUnhealthy
	// StateExcluded means the node's labels do not match Options.NodeSelector; it is not decoded
	// and never written to. Err is [ErrExcluded].
	StateExcluded
)

// States lists every State in order, for metrics and tests.
func States() []State {
	return []State{StateRegistered, StateAbsent, StateMalformed, StateNoDevices, StateInvalidElement, StateUnhealthy, StateExcluded}
}

// String returns the state's name as used in metric labels.
func (s State) String() string {
	switch s {
	case StateRegistered:
		return "registered"
	case StateAbsent:
		return "absent"
	case StateMalformed:
		return "malformed"
	case StateNoDevices:
		return "no-devices"
	case StateInvalidElement:
		return "invalid-element"
	case StateUnhealthy:
		return "unhealthy"
	case StateExcluded:
		return "excluded"
	default:
		return "unknown"
	}
}

// Registration is the state of one vendor on one node. Values returned by the cache are shared
// and read-only: do not modify Devices.
type Registration struct {
	// Vendor is HAMi's vendor word ("NVIDIA").
	Vendor string
	// State is the registration state; Reason says why in words.
	State  State
	Reason string
	// Err is nil when registered, else a classified error (see the package's sentinels).
	Err error
	// Devices are the decoded devices; nil unless State is StateRegistered.
	Devices []annotation.Device
	// Allocatable is the node's allocatable count of the vendor's resource.
	Allocatable int64
	// Handshake is the raw handshake annotation value ("" when absent).
	Handshake string
	// PairScores are the devices' topology scores from the vendor's score annotation
	// (hami.io/node-nvidia-score), parallel to Devices as annotation.ScoresByDevice attaches
	// them; nil when the node publishes none, when no entry names a device, when the
	// annotation does not decode, and unless State is StateRegistered. Shared and read-only.
	PairScores []map[string]int
	// ScoreErr is the error of a score annotation that does not decode (errors.Is
	// annotation.ErrMalformed), nil otherwise. The node still registers without scores: HAMi's
	// scheduler drops the whole node ("node unregistered").
	ScoreErr error
}

// equal reports whether two registrations would look the same to a reader. Devices compare by
// identity: a new decode always produces a new slice.
func (r *Registration) equal(o *Registration) bool {
	return r.Vendor == o.Vendor && r.State == o.State && r.Reason == o.Reason && r.Err == o.Err && //nolint:errorlint // identity
		r.Allocatable == o.Allocatable && r.Handshake == o.Handshake && r.ScoreErr == o.ScoreErr && //nolint:errorlint // identity
		sameDevices(r.Devices, o.Devices) && sameScores(r.PairScores, o.PairScores)
}

func sameScores(a, b []map[string]int) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func sameDevices(a, b []annotation.Device) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// NodeInfo is the cache's view of one node: one Registration per configured vendor, in the
// order of Options.Vendors. A NodeInfo is immutable once returned; a change produces a new one.
type NodeInfo struct {
	// Name and UID of the Node.
	Name string
	UID  types.UID
	// Cordon is the Node's hami.io/device-cordon annotation (HAMi master: GPUs, by UUID, that
	// take no new pods), "" without one.
	Cordon string
	// Registrations holds one entry per configured vendor.
	Registrations []Registration
}

// Registered reports whether at least one vendor is registered on the node.
func (n *NodeInfo) Registered() bool {
	for i := range n.Registrations {
		if n.Registrations[i].State == StateRegistered {
			return true
		}
	}
	return false
}

// Registration returns the registration of vendor (matched by its Name, HAMi's vendor word),
// false when the cache does not track the vendor.
func (n *NodeInfo) Registration(vendor annotation.Vendor) (Registration, bool) {
	for _, r := range n.Registrations {
		if r.Vendor == vendor.Name {
			return r, true
		}
	}
	return Registration{}, false
}

// Devices returns the devices of vendor when it is registered on the node, else nil. The slice
// is shared and read-only.
func (n *NodeInfo) Devices(vendor annotation.Vendor) []annotation.Device {
	r, ok := n.Registration(vendor)
	if !ok || r.State != StateRegistered {
		return nil
	}
	return r.Devices
}

// Snapshot is a consistent, immutable view of every node the cache knows, taken at one point in
// time: the registered nodes for a scheduler to place work on ([Snapshot.All]), and every other
// node with its states and reasons ([Snapshot.Node]), so that a rejection is explained from the
// same view the decision was made on. It is safe for concurrent use and never changes.
type Snapshot struct {
	generation uint64 // the cache's content generation it was taken at
	nodes      map[string]*NodeInfo
	sorted     []*NodeInfo // registered nodes only
}

// Len returns the number of registered nodes.
func (s *Snapshot) Len() int { return len(s.sorted) }

// Node returns a node by name, registered or not (see [NodeInfo.Registered] and each
// [Registration]'s State and Reason); false when the cache does not know the node.
func (s *Snapshot) Node(name string) (*NodeInfo, bool) {
	n, ok := s.nodes[name]
	return n, ok
}

// All yields the registered nodes in name order.
func (s *Snapshot) All() iter.Seq[*NodeInfo] {
	return func(yield func(*NodeInfo) bool) {
		for _, n := range s.sorted {
			if !yield(n) {
				return
			}
		}
	}
}

// Names returns the names of the registered nodes in order, in a new slice.
func (s *Snapshot) Names() []string {
	out := make([]string, len(s.sorted))
	for i, n := range s.sorted {
		out[i] = n.Name
	}
	return out
}

// Registered yields each node registered for vendor with its devices (in the order of its
// register annotation, shared and read-only), in name order: the node source of HAMi's metric
// families (usage.NewHAMiCollector).
func (s *Snapshot) Registered(vendor string) iter.Seq2[string, []annotation.Device] {
	return func(yield func(string, []annotation.Device) bool) {
		for _, n := range s.sorted {
			for i := range n.Registrations {
				if r := &n.Registrations[i]; r.Vendor == vendor && r.State == StateRegistered {
					if !yield(n.Name, r.Devices) {
						return
					}
				}
			}
		}
	}
}
