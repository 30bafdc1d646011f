package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// printer writes the quickstart's lines; safe for concurrent use.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func newPrinter(w io.Writer) *printer { return &printer{w: w} }

// linef writes one line.
func (p *printer) linef(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// step writes a step's heading.
func (p *printer) step(n int, elapsed time.Duration, format string, args ...any) {
	p.linef("")
	p.linef("== %d. %s   [%v]", n, fmt.Sprintf(format, args...), round(elapsed))
}

// item writes an indented "label  text" line.
func (p *printer) item(label, format string, args ...any) {
	p.linef("   %-12s %s", label, fmt.Sprintf(format, args...))
}

// block writes text indented, one line per line.
func (p *printer) block(indent, text string) {
	for line := range strings.SplitSeq(strings.TrimRight(text, "\n"), "\n") {
		p.linef("%s%s", indent, line)
	}
}

// round makes a duration readable: milliseconds below a second, else tenths.
func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}
