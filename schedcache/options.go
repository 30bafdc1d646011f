package schedcache

import (
	"cmp"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/hamireg/hamireg/annotation"
	"github.com/hamireg/hamireg/handshake"
)

// Defaults of [Options].
const (
	// DefaultTick is HAMi's register period: handshake windows are re-evaluated this often.
	DefaultTick = 15 * time.Second
	// DefaultFieldManager is the field manager of handshake patches ([HandshakerOptions]).
	DefaultFieldManager = "hamireg-schedcache"
	// DefaultWriteQPS and DefaultWriteBurst limit handshake writes over all nodes
	// ([HandshakerOptions]).
	DefaultWriteQPS   = 10
	DefaultWriteBurst = 100
	// DefaultWriteWorkers is the number of goroutines that write handshakes ([HandshakerOptions]).
	DefaultWriteWorkers = 2
)

// Options configure a [Cache]. The zero value means the defaults documented on each field.
type Options struct {
	// Vendors are the vendors whose registration the cache tracks, usually taken from
	// annotation.Vendors(). Each needs a register annotation in JSON or legacy format, a
	// handshake key, and a ResourceName (the extended resource its device plugin advertises,
	// from which liveness is derived); names must be unique. Nil means annotation.NVIDIA() only.
	Vendors []annotation.Vendor
	// NodeSelector restricts which nodes may register, as HAMi's scheduler.nodeLabelSelector
	// (labels.SelectorFromSet(map) builds it). Nodes that do not match are kept with
	// StateExcluded, not decoded and never written to. Nil means every node. To keep unselected
	// nodes out of memory entirely, give New an informer filtered server-side instead.
	NodeSelector labels.Selector
	// Tick is how often handshake windows are re-evaluated, without decoding anything. Zero
	// means [DefaultTick] (15 s).
	Tick time.Duration
	// Handshake tunes the handshake decisions: Window (zero: 60 s), Location of timestamps
	// (nil: time.Local, as HAMi), Version (zero: HAMi master, cleanup deletes the key).
	Handshake handshake.Options
	// EventRecorder receives Kubernetes Events on Nodes (malformed or invalid annotations,
	// cleanups). Nil means no Events.
	EventRecorder record.EventRecorder
	// Registerer registers the cache's metrics (hamireg_schedcache_*). Nil means no metrics.
	Registerer prometheus.Registerer
	// Clock is the source of time for handshake stamps, windows, the tick and the
	// [Handshaker]'s write queue. Nil means the real clock.
	Clock clock.WithTicker
	// KeepNodeFields stops New from installing [TrimNode] as the Node informer's transform. Set
	// it when the informer is already started or is shared with code that reads Node images or
	// managedFields.
	KeepNodeFields bool
}

// withDefaults validates o and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Vendors == nil {
		o.Vendors = []annotation.Vendor{annotation.NVIDIA()}
	}
	if len(o.Vendors) == 0 {
		return o, fmt.Errorf("validate options: empty vendor list: %w", ErrInvalidOptions)
	}
	seen := map[string]bool{}
	for _, v := range o.Vendors {
		switch {
		case v.Name == "":
			return o, fmt.Errorf("validate options: vendor without a name: %w", ErrInvalidOptions)
		case seen[v.Name]:
			return o, fmt.Errorf("validate options: vendor %s listed twice: %w", v.Name, ErrInvalidOptions)
		}
		if err := v.Validate(annotation.PartHandshake); err != nil {
			return o, fmt.Errorf("validate options: %w: %w", err, ErrInvalidOptions)
		}
		seen[v.Name] = true
	}
	if o.Tick < 0 || o.Handshake.Window < 0 {
		return o, fmt.Errorf("validate options: negative tick or window: %w", ErrInvalidOptions)
	}
	o.Tick = cmp.Or(o.Tick, DefaultTick)
	o.Handshake.Window = cmp.Or(o.Handshake.Window, handshake.DefaultWindow)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o, nil
}

// HandshakerOptions configure a [Handshaker]. The zero value means the defaults documented on
// each field.
type HandshakerOptions struct {
	// FieldManager names the writer in the Node's managedFields. Empty means
	// [DefaultFieldManager].
	FieldManager string
	// WriteQPS and WriteBurst rate-limit handshake writes over all nodes (failed writes also back
	// off per node, 5 ms doubling up to 5 min; a first try waits only for the rate limit). Zero
	// means [DefaultWriteQPS] (10) and [DefaultWriteBurst] (100).
	WriteQPS   float64
	WriteBurst int
	// WriteWorkers is the number of concurrent handshake writers. Zero means
	// [DefaultWriteWorkers] (2).
	WriteWorkers int
}

func (o HandshakerOptions) withDefaults() (HandshakerOptions, error) {
	if o.WriteQPS < 0 || o.WriteBurst < 0 || o.WriteWorkers < 0 {
		return o, fmt.Errorf("validate handshaker options: negative write rate, burst or workers: %w", ErrInvalidOptions)
	}
	o.FieldManager = cmp.Or(o.FieldManager, DefaultFieldManager)
	o.WriteQPS = cmp.Or(o.WriteQPS, DefaultWriteQPS)
	o.WriteBurst = cmp.Or(o.WriteBurst, DefaultWriteBurst)
	o.WriteWorkers = cmp.Or(o.WriteWorkers, DefaultWriteWorkers)
	return o, nil
}
