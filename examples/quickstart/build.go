package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// modulePath is the SDK's module; its go.mod marks the repository root.
const modulePath = "github.com/hamireg/hamireg"

// programs are the example programs of the SDK's root module the quickstart runs, built
// from the checkout.
var programs = []string{"extender", "deviceplugin"}

// doctorBinary is cmd/kubectl-hami_doctor (a module of its own, built from its folder) under the
// name it has as a kubectl plugin ("kubectl hami-doctor").
const doctorBinary = "kubectl-hami_doctor"

// findRepo returns dir, or when it is empty the nearest folder at or above the working
// directory whose go.mod declares the SDK's module.
func findRepo(dir string) (string, error) {
	check := func(d string) bool {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		return err == nil && firstModuleLine(b) == modulePath
	}
	if dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", err
		}
		if !check(abs) {
			return "", fmt.Errorf("--repo %s: no go.mod of module %s there", dir, modulePath)
		}
		return abs, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if check(d) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no hamireg checkout at or above %s: run it from the repository (make quickstart) or give --repo DIR", wd)
		}
	}
}

// firstModuleLine returns the module path a go.mod declares.
func firstModuleLine(gomod []byte) string {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// cacheDir is where the example programs are built: the user's cache, so that later runs
// only relink what changed.
func cacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find the user's cache folder: %w (set XDG_CACHE_HOME)", err)
	}
	return filepath.Join(base, "hamireg", "quickstart", "bin"), nil
}

// peerBinaries returns the folder with kube-apiserver, kube-scheduler and etcd: dir when
// given, else the one hack/k8sbins/build.sh builds (cold: several minutes) or reuses.
func (q *quickstart) peerBinaries(ctx context.Context) (string, error) {
	if q.opts.k8sBin != "" {
		q.out.item("peers", "kube-apiserver, kube-scheduler, etcd from %s", q.opts.k8sBin)
		return q.opts.k8sBin, nil
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(q.opts.repo, "hack", "k8sbins", "build.sh"))
	cmd.Stdout = &stdout
	start := time.Now()
	err := q.withProgress(ctx, cmd, "building kube-apiserver, kube-scheduler and etcd into your cache (first run only: 5-15 minutes on 2 cores)")
	if err != nil {
		return "", fmt.Errorf("hack/k8sbins/build.sh: %w", err)
	}
	dir := strings.TrimSpace(stdout.String())
	q.out.item("peers", "kube-apiserver, kube-scheduler, etcd ready in %v (%s)", round(time.Since(start)), dir)
	return dir, nil
}

// buildPrograms builds the example programs from the checkout into the cache.
func (q *quickstart) buildPrograms(ctx context.Context) (string, error) {
	dir := q.opts.programs
	if dir == "" {
		var err error
		if dir, err = cacheDir(); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, p := range programs {
		args = append(args, "./examples/"+p)
	}
	start := time.Now()
	if err := q.withProgress(ctx, q.goCommand(ctx, q.opts.repo, args...), "building examples/"+strings.Join(programs, ", examples/")); err != nil {
		return "", fmt.Errorf("go build in %s: %w", q.opts.repo, err)
	}
	doctorDir := filepath.Join(q.opts.repo, "cmd", "kubectl-hami_doctor")
	build := q.goCommand(ctx, doctorDir, "build", "-o", filepath.Join(dir, doctorBinary), ".")
	// Its go.work puts the tree's SDK in place of the release its go.mod requires, even where
	// the environment turns workspaces off.
	build.Env = append(build.Env, "GOWORK="+filepath.Join(doctorDir, "go.work"))
	if err := q.withProgress(ctx, build, "building cmd/kubectl-hami_doctor as "+doctorBinary); err != nil {
		return "", fmt.Errorf("go build in %s: %w", doctorDir, err)
	}
	q.out.item("programs", "examples/%s and cmd/kubectl-hami_doctor (%s) built in %v (%s)", strings.Join(programs, ", examples/"), doctorBinary, round(time.Since(start)), dir)
	return dir, nil
}

// goCommand is the go command with args in folder dir, with go-nvml's CGO_CFLAGS.
func (q *quickstart) goCommand(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	if os.Getenv("CGO_CFLAGS") == "" { // go-nvml's header trips deprecation warnings
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	return cmd
}

// withProgress runs cmd, printing its standard error indented and, while it runs longer than
// a few seconds, how long it has been running. The error carries the last lines it printed.
func (q *quickstart) withProgress(ctx context.Context, cmd *exec.Cmd, what string) error {
	r, w := io.Pipe()
	cmd.Stderr = w
	var tail []string
	var wg sync.WaitGroup
	wg.Go(func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			tail = append(tail[max(0, len(tail)-19):], sc.Text())
			q.out.linef("      %s", sc.Text())
		}
	})
	if err := cmd.Start(); err != nil {
		_ = w.Close()
		wg.Wait()
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	start := time.Now()
	tick := time.NewTicker(3 * time.Second)
	defer tick.Stop()
	announced := false
	var err error
loop:
	for {
		select {
		case err = <-done:
			break loop
		case <-tick.C:
			if !announced {
				q.out.item("building", "%s ...", what)
				announced = true
				tick.Reset(20 * time.Second)
				continue
			}
			q.out.item("building", "still building: %v so far", time.Since(start).Round(time.Second))
		}
	}
	_ = w.Close()
	wg.Wait()
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(tail) > 0 {
			return fmt.Errorf("%w:\n%s", err, strings.Join(tail, "\n"))
		}
		return err
	}
	return nil
}
