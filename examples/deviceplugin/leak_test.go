package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the binary if a test leaves a goroutine behind: run joins the agent, the
// metrics server and the simulation's goroutines before it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
