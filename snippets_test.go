package hamireg_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Every Go snippet the reader sees, in README.md and docs/*.md (```go blocks) and in the
// doc.go files of every module of the repository (tab-indented code blocks that are Go), is compiled code: its text
// is, line for line, a region of a _test.go file (or of a program under examples/, which
// shows its own code), between the lines
//
//	// snippet: README        (for a README.md or docs/*.md block; the region may be in any _test.go)
//	// snippet: doc           (for a doc.go block; the region is in the same folder)
//	// end snippet
//
// inside an Example function (or at the top level of a _test.go file), which `go test` and
// `go vet` of that module compile. Lines are compared after removing the common indentation,
// trailing spaces and trailing //nolint comments. A block's line "..." stands for any number of
// region lines. Leading `import "path"` lines of a README block are checked against the imports
// of the region's file instead. To change a snippet, change the block and its region together;
// this test names both when they differ.

// skipDocsUnder holds doc.go files whose snippets are not checked: test/e2e's harness, which
// is internal to the tests (envtest and envtest/kubeletpeer, the library, are checked). Its
// _test.go files are still searched for README regions.
const skipDocsUnder = "test/e2e/"

const (
	markerReadme = "// snippet: README"
	markerDoc    = "// snippet: doc"
	markerEnd    = "// end snippet"
	elision      = "..."
)

// region is the text between a snippet marker and its end marker in a _test.go file.
type region struct {
	file  string // slash path from the repository root
	line  int    // of the marker
	kind  string // "README" or "doc"
	lines []string
	used  bool
}

// block is one Go snippet of a README.md or doc.go.
type block struct {
	file    string
	line    int // of the first code line
	imports []string
	lines   []string
}

func (b block) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

func (r *region) String() string { return fmt.Sprintf("%s:%d", r.file, r.line) }

func TestSnippetsAreCompiled(t *testing.T) {
	t.Parallel()
	regions, docs := scanRepository(t)
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"README.md"}, pages...)
	check := func(b block, candidates []*region, where string) {
		if len(candidates) == 0 {
			t.Errorf("%s: this Go snippet is not compiled: copy it between %q and %q lines into an Example in %s", b, "// snippet: ...", markerEnd, where)
			return
		}
		var best *region
		bestDiff := ""
		for _, r := range candidates {
			if matches(b.lines, r.lines) {
				if missing := missingImports(t, r.file, b.imports); len(missing) > 0 {
					t.Errorf("%s: the snippet imports %q, which region %s's file does not", b, missing, r)
				}
				r.used = true
				return
			}
			d := cmp.Diff(r.lines, b.lines)
			if best == nil || similarity(b.lines, r.lines) > similarity(b.lines, best.lines) {
				best, bestDiff = r, d
			}
		}
		t.Errorf("%s: this Go snippet matches no compiled region in %s; nearest is %s (-region +snippet):\n%s\nUpdate the region (and make it compile) or the snippet so that they are the same text", b, where, best, bestDiff)
	}
	var readmeBlocks []block
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		blocks := markdownBlocks(filepath.ToSlash(page), string(text))
		if page == "README.md" && len(blocks) == 0 {
			t.Fatal("README.md: no ```go blocks found; has the format changed?")
		}
		readmeBlocks = append(readmeBlocks, blocks...)
	}
	for _, b := range readmeBlocks {
		check(b, filter(regions, func(r *region) bool { return r.kind == "README" }), "any _test.go")
	}
	checked := 0
	for _, file := range docs {
		data, err := os.ReadFile(filepath.FromSlash(file))
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.ToSlash(filepath.Dir(filepath.FromSlash(file)))
		for _, b := range docBlocks(file, string(data)) {
			checked++
			check(b, filter(regions, func(r *region) bool { return r.kind == "doc" && pathDir(r.file) == dir }), "a _test.go of "+dir+"/")
		}
	}
	for _, r := range regions {
		if !r.used {
			t.Errorf("%s: %s region matches no snippet: remove its markers, or restore the snippet", r, r.kind)
		}
	}
	t.Logf("checked %d blocks of README.md and docs/*.md and %d doc.go blocks against %d compiled regions", len(readmeBlocks), checked, len(regions))
}

func pathDir(p string) string {
	i := strings.LastIndex(p, "/")
	if i < 0 {
		return "."
	}
	return p[:i]
}

func filter(rs []*region, keep func(*region) bool) []*region {
	var out []*region
	for _, r := range rs {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// scanRepository returns every region of every _test.go and the path of every doc.go, in
// every module of the repository (the working directory is its root).
func scanRepository(t *testing.T) ([]*region, []string) {
	t.Helper()
	var regions []*region
	var docs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if name == "doc.go" && strings.HasPrefix(filepath.ToSlash(path), skipDocsUnder) {
			return nil
		}
		slash := filepath.ToSlash(path)
		switch {
		case name == "doc.go":
			docs = append(docs, slash)
		case strings.HasSuffix(name, "_test.go"), strings.HasSuffix(name, ".go") && strings.HasPrefix(slash, "examples/"):
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rs, err := fileRegions(slash, string(data))
			if err != nil {
				return err
			}
			regions = append(regions, rs...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return regions, docs
}

func fileRegions(file, text string) ([]*region, error) {
	var out []*region
	var cur *region
	for i, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case trimmed == markerReadme || trimmed == markerDoc:
			if cur != nil {
				return nil, fmt.Errorf("%s:%d: snippet marker inside the region of line %d", file, i+1, cur.line)
			}
			cur = &region{file: file, line: i + 1, kind: strings.TrimPrefix(trimmed, "// snippet: ")}
		case trimmed == markerEnd:
			if cur == nil {
				return nil, fmt.Errorf("%s:%d: %q without a snippet marker", file, i+1, markerEnd)
			}
			cur.lines = normalize(cur.lines)
			out = append(out, cur)
			cur = nil
		case strings.HasPrefix(trimmed, "// snippet:"):
			return nil, fmt.Errorf("%s:%d: unknown snippet marker %q (want %q or %q)", file, i+1, trimmed, markerReadme, markerDoc)
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: snippet marker without %q", file, cur.line, markerEnd)
	}
	return out, nil
}

var importLine = regexp.MustCompile(`^import (?:[A-Za-z_][A-Za-z0-9_]* )?("[^"]+")$`)

// markdownBlocks returns the ```go blocks of a Markdown file.
func markdownBlocks(file, text string) []block {
	var out []block
	var cur *block
	for i, l := range strings.Split(text, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur = &block{file: file, line: i + 2}
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, finishBlock(*cur))
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	return out
}

// finishBlock moves leading import lines out of the code and normalizes it.
func finishBlock(b block) block {
	lines := b.lines
	for len(lines) > 0 {
		s := strings.TrimSpace(lines[0])
		if m := importLine.FindStringSubmatch(s); m != nil {
			path, _ := strconv.Unquote(m[1])
			b.imports = append(b.imports, path)
		} else if s != "" {
			break
		}
		lines = lines[1:]
		b.line++
	}
	b.lines = normalize(lines)
	return b
}

// docBlocks returns the code blocks of a file's doc comments that are Go: blocks that parse
// as Go (statements or declarations) or that declare variables. Other blocks (YAML, JSON, log
// lines, shell) are prose to this test.
func docBlocks(file, text string) []block {
	var out []block
	var cur *block
	flush := func() {
		if cur != nil {
			for len(cur.lines) > 0 && cur.lines[len(cur.lines)-1] == "" {
				cur.lines = cur.lines[:len(cur.lines)-1]
			}
			if isGo(cur.lines) {
				out = append(out, finishBlock(*cur))
			}
		}
		cur = nil
	}
	for i, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "//\t"):
			if cur == nil {
				cur = &block{file: file, line: i + 1}
			}
			cur.lines = append(cur.lines, strings.TrimPrefix(l, "//"))
		case cur != nil && strings.TrimSpace(l) == "//":
			cur.lines = append(cur.lines, "")
		default:
			flush()
		}
	}
	flush()
	return out
}

func isGo(lines []string) bool {
	src := strings.Join(lines, "\n")
	if strings.Contains(src, ":=") {
		return true
	}
	var kept []string
	for _, l := range lines {
		if strings.TrimSpace(l) != elision {
			kept = append(kept, l)
		}
	}
	withoutElision := strings.Join(kept, "\n")
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+withoutElision+"\n}\n", 0); err == nil {
		return true
	}
	_, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+withoutElision+"\n", 0)
	return err == nil
}

var nolint = regexp.MustCompile(`\s*//nolint:.*$`)

// normalize drops leading and trailing blank lines, trailing spaces, //nolint comments and
// the indentation common to every non-blank line.
func normalize(lines []string) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, strings.TrimRight(nolint.ReplaceAllString(l, ""), " \t"))
	}
	for len(out) > 0 && out[0] == "" {
		out = out[1:]
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	indent := -1
	for _, l := range out {
		if l == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range out {
		if l != "" {
			out[i] = l[indent:]
		}
	}
	return out
}

// matches reports whether snippet equals region, where a snippet line "..." stands for any
// number of region lines.
func matches(snippet, region []string) bool {
	if len(snippet) == 0 {
		return len(region) == 0
	}
	if strings.TrimSpace(snippet[0]) == elision {
		for skip := 0; skip <= len(region); skip++ {
			if matches(snippet[1:], region[skip:]) {
				return true
			}
		}
		return false
	}
	return len(region) > 0 && snippet[0] == region[0] && matches(snippet[1:], region[1:])
}

// similarity counts the snippet's lines found in the region, to name the nearest region.
func similarity(snippet, region []string) int {
	n := 0
	for _, l := range snippet {
		if slices.Contains(region, l) {
			n++
		}
	}
	return n
}

func missingImports(t *testing.T, file string, want []string) []string {
	t.Helper()
	if len(want) == 0 {
		return nil
	}
	f, err := parser.ParseFile(token.NewFileSet(), filepath.FromSlash(file), nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, w := range want {
		if !slices.ContainsFunc(f.Imports, func(s *ast.ImportSpec) bool { return s.Path.Value == strconv.Quote(w) }) {
			missing = append(missing, w)
		}
	}
	return missing
}
