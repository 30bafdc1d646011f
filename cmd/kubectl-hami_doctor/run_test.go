package main

import (
	"context"
	"io"
)

// run runs the program as "doctor" with the real cluster connection, as main does.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return newCLI(context.Background(), "doctor", stdin, stdout, stderr).run(args)
}
