package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// Release is the tree at one version: every released module's go.mod (its SDK modules
// required at that version) and go.sum (with their hashes), as the release commit holds them.
type Release struct {
	Version string
	Modules []Module
	// GoMod and GoSum are the files of each module at Version, by module path.
	GoMod, GoSum map[string][]byte
	// Sums are each module's go.sum lines ("path version h1:…" and "path version/go.mod h1:…").
	Sums map[string][]string
}

// Prepare computes the release of the tree at root at version v, and, when proxyDir is not
// empty, writes every module there in the layout of a GOPROXY=file:// module proxy (list,
// .info, .mod, .zip), made with golang.org/x/mod/zip as the go command makes them. The tree
// itself is not changed.
func Prepare(root, v, proxyDir string) (*Release, error) {
	if err := checkVersion(v); err != nil {
		return nil, err
	}
	mods, err := Modules(root)
	if err != nil {
		return nil, err
	}
	r := &Release{Version: v, Modules: mods, GoMod: map[string][]byte{}, GoSum: map[string][]byte{}, Sums: map[string][]string{}}
	scratch := proxyDir
	if scratch == "" {
		if scratch, err = os.MkdirTemp("", "hamireg-release-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(scratch) //nolint:errcheck // a temporary folder
	}
	for _, m := range mods { // dependency order: a module's SDK requires are hashed before it
		gomod, err := versionedModFile(root, m, v)
		if err != nil {
			return nil, err
		}
		sum, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m.Dir), "go.sum"))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		gosum := withSums(sum, r.Sums, closure(m, mods))
		r.GoMod[m.Path], r.GoSum[m.Path] = gomod, gosum

		dir := filepath.Join(scratch, filepath.FromSlash(mustEscape(m.Path)), "@v")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		zipName := filepath.Join(dir, v+".zip")
		if err := writeZip(root, m, v, gomod, gosum, zipName); err != nil {
			return nil, err
		}
		h1, err := dirhash.HashZip(zipName, dirhash.Hash1)
		if err != nil {
			return nil, fmt.Errorf("hash the zip of %s@%s: %w", m.Path, v, err)
		}
		modH1, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(gomod)), nil
		})
		if err != nil {
			return nil, err
		}
		r.Sums[m.Path] = []string{m.Path + " " + v + " " + h1, m.Path + " " + v + "/go.mod " + modH1}
		info, err := json.Marshal(struct {
			Version string
			Time    time.Time
		}{v, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil {
			return nil, err
		}
		for name, data := range map[string][]byte{v + ".mod": gomod, v + ".info": info, "list": []byte(v + "\n")} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

func mustEscape(p string) string {
	e, err := module.EscapePath(p)
	if err != nil {
		panic(err) // the paths were checked when the go.mod files were parsed
	}
	return e
}

// zipFile is one file of a module zip, from the tree or from memory.
type zipFile struct {
	path string // in the zip, relative to the module root
	disk string // on disk; "" when data is set
	data []byte
}

func (f zipFile) Path() string { return f.path }

func (f zipFile) Lstat() (fs.FileInfo, error) {
	if f.disk != "" {
		return os.Lstat(f.disk)
	}
	return memInfo{name: filepath.Base(f.path), size: int64(len(f.data))}, nil
}

func (f zipFile) Open() (io.ReadCloser, error) {
	if f.disk != "" {
		return os.Open(f.disk)
	}
	return io.NopCloser(bytes.NewReader(f.data)), nil
}

type memInfo struct {
	name string
	size int64
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return 0o644 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }

// writeZip writes the module zip of m at v: its tracked files, go.mod and go.sum replaced.
func writeZip(root string, m Module, v string, gomod, gosum []byte, name string) error {
	files := []modzip.File{zipFile{path: "go.mod", data: gomod}}
	if len(gosum) > 0 {
		files = append(files, zipFile{path: "go.sum", data: gosum})
	}
	for _, f := range m.files {
		if f == "go.mod" || f == "go.sum" {
			continue
		}
		files = append(files, zipFile{path: f, disk: filepath.Join(root, filepath.FromSlash(m.Dir), filepath.FromSlash(f))})
	}
	out, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := modzip.Create(out, module.Version{Path: m.Path, Version: v}, files); err != nil {
		out.Close() //nolint:errcheck // the zip error wins
		return fmt.Errorf("zip %s@%s: %w", m.Path, v, err)
	}
	return out.Close()
}

// SetVersion writes the release r into the tree at root: every released module's go.mod and
// go.sum as r has them. It is the one change of a release commit.
func SetVersion(root string, r *Release) error {
	for _, m := range r.Modules {
		dir := filepath.Join(root, filepath.FromSlash(m.Dir))
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), r.GoMod[m.Path], 0o644); err != nil {
			return err
		}
		if len(r.GoSum[m.Path]) > 0 {
			if err := os.WriteFile(filepath.Join(dir, "go.sum"), r.GoSum[m.Path], 0o644); err != nil {
				return err
			}
		}
	}
	// Modules that are developed here but not released (test/e2e) require the same version.
	mods, err := devModules(root)
	if err != nil {
		return err
	}
	for _, m := range mods {
		gomod, err := versionedModFile(root, m, r.Version)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(m.Dir), "go.mod"), gomod, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// devModules returns the modules under devOnly folders that require SDK modules.
func devModules(root string) ([]Module, error) {
	var out []Module
	for _, top := range devOnly {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "go.mod" {
				return err
			}
			rel, err := filepath.Rel(root, filepath.Dir(p))
			if err != nil {
				return err
			}
			m := Module{Dir: filepath.ToSlash(rel)}
			mf, err := readModFile(root, m)
			if err != nil {
				return err
			}
			for _, r := range mf.Require {
				if isSDK(r.Mod.Path) {
					out = append(out, m)
					break
				}
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
	}
	return out, nil
}

// GoproxyEnv returns the GOPROXY value that puts the file proxy in dir before the machine's.
func GoproxyEnv(dir, current string) string {
	u := "file://" + filepath.ToSlash(dir)
	if current == "" || current == "off" {
		return u
	}
	return u + "," + strings.TrimPrefix(current, ",")
}
