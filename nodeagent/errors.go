package nodeagent

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Sentinel errors: test with errors.Is. Allocate's errors are [*AllocateError] values that
// unwrap to one of the Allocate classes and to the cause.
var (
	// ErrInvalidOptions means [New] was given arguments or options it cannot work with.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrAlreadyRunning means [Agent.Run] was called while another Run had not returned.
	ErrAlreadyRunning = errors.New("node agent already running")

	// ErrNoBindingPod means Allocate found no pod to serve: the Node carries no node lock (or a
	// legacy one that names no pod), or the pod it names is not bound to this node or not
	// being allocated. HAMi's words: "no binding pod found on node <node>".
	ErrNoBindingPod = errors.New("no binding pod found")
	// ErrPodGone means the pod the node lock names no longer exists (deleted between bind and
	// Allocate); the lock is released.
	ErrPodGone = errors.New("pod of the node lock not found")
	// ErrNoPendingEntry means the pod has no container entry left to allocate (HAMi master's
	// words; v2.9.0 says "device request not found").
	ErrNoPendingEntry = errors.New("no pending device allocation found")
	// ErrDeviceCountMismatch means the kubelet asked for another number of devices than the
	// pod's next container entry holds (HAMi's words: "device number not matched").
	ErrDeviceCountMismatch = errors.New("device number not matched")
	// ErrMalformed means the node lock or the pod's device annotation does not parse. The
	// error also matches nodelock.ErrMalformed or allocation.ErrMalformed.
	ErrMalformed = errors.New("malformed annotation")
	// ErrAPI means a request to the API server failed (after retries of transient errors).
	ErrAPI = errors.New("api request failed")
	// ErrHost means preparing the container's HAMi-core state folder on the host failed
	// ([HAMiCore].PrepareStateDir); an [Allocator] may wrap it for host failures of its own.
	ErrHost = errors.New("host preparation failed")
	// ErrAllocator means the vendor's [Allocator] (Options.Allocator) returned an error, or an
	// answer the kubelet cannot use (a device node without a path, a CDI name that is not
	// fully qualified).
	ErrAllocator = errors.New("device allocator failed")
	// ErrMIG means the container's MIG devices could not be realised: no MIG reservation (or
	// too few) for the container in hami.io/vgpu-mig-allocations, a reservation naming another
	// GPU than the entry, the node's MIG manager failing (an NVML error: MIG mode pending a
	// reset, a placement NVML does not list for the profile, ...), the placement taken
	// ([ErrPlacementTaken]), Options.MIG unset, or a HAMi v2.9.0 MIG entry, which this agent
	// does not serve (see the package documentation).
	ErrMIG = errors.New("MIG allocation failed")
	// ErrPlacementTaken is the cause of an [ErrMIG] failure whose reserved placement overlaps a
	// MIG device that another live reservation owns.
	ErrPlacementTaken = errors.New("MIG placement taken")
)

// AllocateError says why Allocate refused a container, which pod it was for (when known) and
// what the agent did about it. It unwraps to its class (one of the Allocate sentinels) and to
// the cause.
type AllocateError struct {
	// Node is the agent's node.
	Node string
	// Pod is the pod served, zero when none was found.
	Pod types.NamespacedName
	// Container is the container whose entry was served, "" when not known.
	Container string
	// Kind is the class: [ErrNoBindingPod], [ErrPodGone], [ErrNoPendingEntry],
	// [ErrDeviceCountMismatch], [ErrMalformed], [ErrAPI], [ErrHost], [ErrAllocator],
	// [ErrMIG] or [ErrOwnership] (with Options.DRA: a GPU of the DRA world, or one that
	// prepared claims hold).
	Kind error
	// Detail says what was found, in words.
	Detail string
	// PhaseFailed and LockReleased say whether the agent set the pod's bind-phase to failed
	// and removed the node lock.
	PhaseFailed, LockReleased bool
	// Err is the cause, nil when Detail says it all.
	Err error

	// finishing is set when the agent tried to set bind-phase failed and release the lock.
	finishing bool
}

// Error implements error. The text starts with HAMi's words for the class, names the pod
// and container, and ends with what was done and what to do, e.g.
//
//	device number not matched: pod default/train container worker: the kubelet asked for 1 device(s), the scheduler assigned 2; bind-phase set to failed and node lock released: delete the pod (its controller recreates it) to schedule it again
func (e *AllocateError) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	if errors.Is(e.Kind, ErrNoBindingPod) {
		fmt.Fprintf(&b, " on node %s", e.Node)
	}
	if e.Pod.Name != "" {
		fmt.Fprintf(&b, ": pod %s", e.Pod)
		if e.Container != "" {
			fmt.Fprintf(&b, " container %s", e.Container)
		}
	}
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	switch {
	case e.PhaseFailed && e.LockReleased:
		b.WriteString("; bind-phase set to failed and node lock released: delete the pod (its controller recreates it) to schedule it again")
	case e.PhaseFailed:
		b.WriteString("; bind-phase set to failed, but the node lock could not be released (it expires after the scheduler's --node-lock-timeout): delete the pod to schedule it again")
	case e.LockReleased:
		b.WriteString("; node lock released")
	}
	return b.String()
}

// Unwrap returns the class and the cause.
func (e *AllocateError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}
