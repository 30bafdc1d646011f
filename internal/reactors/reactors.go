// Package reactors holds reactors for client-go's fake clientset that the unit tests across
// the SDK share. Only tests import it.
package reactors

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// Fail makes the next n requests verb resource (e.g. "patch", "nodes") on f fail with err; n
// below 0 makes all of them fail. Requests after the n-th go on to the other reactors.
func Fail(f *k8stesting.Fake, verb, resource string, n int, err error) {
	var mu sync.Mutex
	f.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if n == 0 {
			return false, nil, nil
		}
		n--
		return true, nil, err
	})
}
