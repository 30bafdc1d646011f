package nodeagent

import (
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// forwardRecorder hands Events to the recorder set last, or drops them while there is none. It
// lets the register Writer, made in New, record through the broadcaster that Run starts.
type forwardRecorder struct {
	r atomic.Pointer[record.EventRecorder]
}

var _ record.EventRecorder = (*forwardRecorder)(nil)

func (f *forwardRecorder) set(r record.EventRecorder) {
	if r == nil {
		f.r.Store(nil)
		return
	}
	f.r.Store(&r)
}

func (f *forwardRecorder) get() record.EventRecorder {
	if p := f.r.Load(); p != nil {
		return *p
	}
	return nil
}

func (f *forwardRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	if r := f.get(); r != nil {
		r.Event(obj, eventtype, reason, message)
	}
}

func (f *forwardRecorder) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if r := f.get(); r != nil {
		r.Eventf(obj, eventtype, reason, messageFmt, args...)
	}
}

func (f *forwardRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	if r := f.get(); r != nil {
		r.AnnotatedEventf(obj, annotations, eventtype, reason, messageFmt, args...)
	}
}
