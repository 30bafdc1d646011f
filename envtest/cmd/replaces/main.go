package main

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

// block is the replace block of envtest/kubeletpeer's go.mod, comment line included.
//
//go:embed block.txt
var block string

// ErrNoReplaces is returned when the embedded block holds no replace directive.
var ErrNoReplaces = errors.New("embedded block has no replace directives")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replaces", flag.ContinueOnError)
	fs.SetOutput(stderr)
	write := fs.Bool("w", false, "write the block into the go.mod instead of printing it")
	path := fs.String("modfile", "go.mod", "the go.mod to rewrite with -w")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: replaces [-w] [-modfile go.mod]\n\n"+
			"Prints the k8s.io replace lines (%s) that a module requiring\n"+
			"github.com/hamireg/hamireg/envtest/kubeletpeer needs in its go.mod, or with -w writes\n"+
			"them into the go.mod. A module that uses only github.com/hamireg/hamireg/envtest needs none.\n\n", kubernetesVersion())
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "replaces: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if !*write {
		fmt.Fprint(stdout, block)
		return 0
	}
	n, err := rewrite(*path)
	if err != nil {
		fmt.Fprintf(stderr, "replaces: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "replaces: %s: %d replace lines for %s\n", *path, n, kubernetesVersion())
	return 0
}

// rewrite applies the block to the go.mod at path and returns how many replace lines it has.
func rewrite(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	out, n, err := apply(path, data)
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return n, os.WriteFile(path, out, st.Mode().Perm())
}

// apply returns data, a go.mod, without its replace directives for the modules the block
// names and with the block appended, and the number of the block's replace lines.
func apply(path string, data []byte) ([]byte, int, error) {
	want, err := modfile.Parse("block.txt", []byte("module block\n\n"+block), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("parse the embedded block: %w", err)
	}
	if len(want.Replace) == 0 {
		return nil, 0, ErrNoReplaces
	}
	named := make(map[string]bool, len(want.Replace))
	for _, r := range want.Replace {
		named[r.Old.Path] = true
	}
	f, err := modfile.Parse(path, data, nil)
	if err != nil {
		return nil, 0, err
	}
	var drop []module.Version
	for _, r := range f.Replace {
		if named[r.Old.Path] {
			drop = append(drop, r.Old)
		}
	}
	for _, old := range drop {
		if err := f.DropReplace(old.Path, old.Version); err != nil {
			return nil, 0, err
		}
	}
	f.Cleanup()
	out := strings.TrimRight(string(modfile.Format(f.Syntax)), "\n") + "\n\n" + block
	if _, err := modfile.Parse(path, []byte(out), nil); err != nil {
		return nil, 0, fmt.Errorf("the rewritten go.mod does not parse: %w", err)
	}
	return []byte(out), len(want.Replace), nil
}

var versionRE = regexp.MustCompile(`k8s\.io/kubernetes@(v[0-9][^ ]*)`)

// kubernetesVersion is the k8s.io/kubernetes version the block's comment names.
func kubernetesVersion() string {
	if m := versionRE.FindStringSubmatch(block); m != nil {
		return "k8s.io/kubernetes " + m[1]
	}
	return "k8s.io/kubernetes"
}
