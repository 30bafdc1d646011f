// Package clienttest makes client-go's fake clientset behave like the API server where the
// SDK's components depend on it, for unit tests of components built on the SDK (a node
// agent, a scheduler extender, a controller that patches Nodes or Pods).
//
// The fake's object tracker applies a JSON merge patch without changing the object's
// resourceVersion and without checking a resourceVersion the patch carries. Code that orders
// writes by resourceVersion (package register tells a late echo of its own write from drift
// that way) or relies on optimistic concurrency (package nodelock's lock patches) then sees
// an API server that does not exist. [NewClientset] returns a fake clientset whose Node and
// Pod merge patches give the object a new, larger resourceVersion and fail with 409 Conflict
// on a stale one; [ResourceVersions] adds the same to a clientset of your own.
// [NextResourceVersion] numbers the objects a test writes itself through the tracker. [Fail]
// makes the next n requests of a verb and resource fail, for an API server that is away or
// refuses.
//
// Only tests should import this package. Its functions are safe for concurrent use; the
// reactors serialise the patches they apply.
package clienttest
