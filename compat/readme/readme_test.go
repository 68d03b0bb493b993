// Package readme tests the README: its first program builds, and its test
// command covers every module of the workspace.
package readme

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFirstProgramBuilds extracts the README's first Go block, a complete
// program, and builds it in a module of its own that requires sluice (this
// checkout) and openai-go (at this module's version) as a user's would.
func TestFirstProgramBuilds(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// 150, and 10 for the proxy's section (docs/proxy.md holds the rest).
	if n := strings.Count(string(readme), "\n"); n > 160 {
		t.Errorf("the README is %d lines; keep it to 160 (details go to docs/)", n)
	}
	_, rest, ok := strings.Cut(string(readme), "```go\npackage main\n")
	if !ok {
		t.Fatal("README: no Go block starting with package main")
	}
	program, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README: the first program's block is not closed")
	}
	if n := strings.Count(program, "\n") + 1; n > 25 {
		t.Errorf("the first program is %d lines; keep it to 25", n)
	}
	dir := t.TempDir()
	var sums []byte
	for _, f := range []string{"go.sum", "compat/go.sum"} {
		sum, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sum...)
	}
	openai := requirement(t, filepath.Join(root, "compat/go.mod"), "github.com/openai/openai-go/v3")
	for name, data := range map[string]string{
		"main.go": "package main\n" + program,
		"go.mod": "module readme\n\ngo 1.26.0\n\nrequire (\n\tgithub.com/sluicehq/sluice v0.0.0\n\t" + openai + "\n)\n\n" +
			"replace github.com/sluicehq/sluice => " + root + "\n",
		"go.sum": string(sums),
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

// requirement returns the line of the go.mod at path that requires mod:
// "mod version".
func requirement(t *testing.T, path, mod string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == mod {
			return f[0] + " " + f[1]
		}
	}
	t.Fatalf("%s does not require %s", path, mod)
	return ""
}

// TestTestCommandCoversEveryModule checks that the README's test command,
// the first line of its first shell block that starts "go test", names the
// packages of every module of the workspace: in workspace mode ./... stops
// at the directory of another module, as it does in module mode.
func TestTestCommandCoversEveryModule(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```sh\n")
	if !ok {
		t.Fatal("README: no shell block")
	}
	block, _, _ := strings.Cut(rest, "```")
	var patterns []string
	for line := range strings.Lines(block) {
		if strings.HasPrefix(line, "go test ") {
			command, _, _ := strings.Cut(line, "#")
			patterns = strings.Fields(command)[2:]
			break
		}
	}
	if patterns == nil {
		t.Fatal("README: no go test command in the first shell block")
	}
	cmd := exec.Command("go", "work", "edit", "-json")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go work edit -json: %v", err)
	}
	var work struct{ Use []struct{ DiskPath string } }
	if err := json.Unmarshal(out, &work); err != nil {
		t.Fatal(err)
	}
	if len(work.Use) == 0 {
		t.Fatal("go.work uses no module")
	}
	for _, u := range work.Use {
		want := "./" + filepath.ToSlash(filepath.Clean(u.DiskPath)) + "/..."
		if u.DiskPath == "." {
			want = "./..."
		}
		if !slices.Contains(patterns, want) {
			t.Errorf("the README's test command %q does not name %s, the packages of the module in %s", patterns, want, u.DiskPath)
		}
	}
}
