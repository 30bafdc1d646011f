package nodeagent

import "sync"

// Changes keeps the Changed channel of a [Source] the way the SDK's contract asks: one
// channel shared by every waiter, closed at the next change and then replaced. Embed it in a
// source (its zero value is ready) and call [Changes.Notify] where the devices change; the
// source's Changed method is then Changes.Changed. Read the devices after taking the
// channel, as the agent does, and no change is missed: one that happens while a scan runs
// closes the channel the agent already holds, and it scans again.
type Changes struct {
	mu sync.Mutex
	ch chan struct{}
}

// Changed returns the channel that the next [Changes.Notify] closes.
func (c *Changes) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

// Notify closes the channel that [Changes.Changed] returned, waking every waiter, and starts
// the next one. A Notify without a waiter is not lost: the next Changed is a fresh channel,
// and the agent's next scan reads the changed devices anyway.
func (c *Changes) Notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		close(c.ch)
	}
	c.ch = make(chan struct{})
}
