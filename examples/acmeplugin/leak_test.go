package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the binary if a test leaves a goroutine behind: run joins the agent and the
// metrics server before it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
