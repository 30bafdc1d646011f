package schedcache

import "k8s.io/client-go/tools/cache"

// Informer returns the Node informer the cache was created with, for a component that shares
// it and waits on Node changes the cache does not track (the extender's bind waits there for a
// node lock to go, without polling). Its store is the informer's: read-only. Handlers added to
// it are the caller's to remove.
func (c *Cache) Informer() cache.SharedIndexInformer { return c.informer }
