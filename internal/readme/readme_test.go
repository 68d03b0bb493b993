// Package readme tests the README's first program.
package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFirstProgramBuilds extracts the README's first Go block, a complete
// program, and builds it in a module of its own that requires sluice (this
// checkout) as a user's would.
func TestFirstProgramBuilds(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```go\npackage main\n")
	if !ok {
		t.Fatal("README: no Go block starting with package main")
	}
	program, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README: the first program's block is not closed")
	}
	if n := strings.Count(program, "\n") + 1; n > 40 {
		t.Errorf("the first program is %d lines; keep it short", n)
	}
	dir := t.TempDir()
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"main.go": "package main\n" + program,
		"go.mod": "module readme\n\ngo 1.26.0\n\nrequire github.com/sluicehq/sluice v0.0.0\n\n" +
			"replace github.com/sluicehq/sluice => " + root + "\n",
		"go.sum": string(sum),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
	cmd.Dir = dir
	// From the module cache only, as the tests of this checkout left it.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's first program does not build: %v\n%s", err, out)
	}
}
