// Package readme tests the README: its programs build and follow its
// advice, and its test command covers every module of the workspace.
package readme

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestProgramsBuild extracts the README's programs, each a Go block that
// starts with package main (the first calls OpenAI, the second Anthropic),
// checks that each does what the README advises, and builds each in a
// module of its own that requires sluice (this checkout) and the SDKs (at
// this module's versions) as a user's would.
func TestProgramsBuild(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 250 {
		t.Errorf("the README is %d lines; keep it to 250 (details go to docs/)", n)
	}
	programs := goPrograms(string(readme))
	if len(programs) != 2 {
		t.Fatalf("README: %d Go blocks start with package main; want 2, for OpenAI and Anthropic", len(programs))
	}
	var sums []byte
	for _, f := range []string{"go.sum", "compat/go.sum"} {
		sum, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sum...)
	}
	compat := filepath.Join(root, "compat/go.mod")
	requires := requirement(t, compat, "github.com/openai/openai-go/v3") + "\n\t" +
		requirement(t, compat, "github.com/anthropics/anthropic-sdk-go/v2")
	for i, sdk := range []string{"github.com/openai/openai-go/v3", "github.com/anthropics/anthropic-sdk-go/v2"} {
		program := programs[i]
		t.Run(strings.Split(sdk, "/")[2], func(t *testing.T) {
			if n := strings.Count(program, "\n"); n > 35 {
				t.Errorf("the program is %d lines; keep it to 35", n)
			}
			if !strings.Contains(program, `"`+sdk+`"`) {
				t.Errorf("the program does not import %s", sdk)
			}
			for _, miss := range advised(t, program) {
				t.Errorf("the program does not %s", miss)
			}
			dir := t.TempDir()
			for name, data := range map[string]string{
				"main.go": program,
				"go.mod": "module readme\n\ngo 1.26.0\n\nrequire (\n\tgithub.com/sluicehq/sluice v0.0.0\n\t" + requires + "\n)\n\n" +
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
				t.Fatalf("the README's program does not build: %v\n%s", err, out)
			}
		})
	}
}

// goPrograms returns the Go blocks of readme that start with package main.
func goPrograms(readme string) []string {
	var programs []string
	for rest := readme; ; {
		var ok bool
		_, rest, ok = strings.Cut(rest, "```go\npackage main\n")
		if !ok {
			return programs
		}
		var program string
		program, rest, _ = strings.Cut(rest, "```")
		programs = append(programs, "package main\n"+program)
	}
}

// advised returns what of the README's advice program does not follow: the
// SDK's retries off (option.WithMaxRetries(0): sluice retries, through the
// bucket), a cap on the completion (MaxTokens or MaxCompletionTokens: the
// charge is the prompt's estimate plus it, 1,024 if unset), and a bound on
// the wait (a context deadline, or transport.WithMaxWait).
func advised(t *testing.T, program string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", program, 0)
	if err != nil {
		t.Fatalf("the program does not parse: %v", err)
	}
	var retriesOff, maxTokens, bounded bool
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			switch name := selector(n.Fun); name {
			case "option.WithMaxRetries":
				lit, ok := n.Args[0].(*ast.BasicLit)
				retriesOff = retriesOff || ok && lit.Value == "0"
			case "context.WithTimeout", "context.WithDeadline", "transport.WithMaxWait":
				bounded = true
			}
		case *ast.KeyValueExpr:
			if id, ok := n.Key.(*ast.Ident); ok && (id.Name == "MaxTokens" || id.Name == "MaxCompletionTokens") {
				maxTokens = true
			}
		}
		return true
	})
	var miss []string
	if !retriesOff {
		miss = append(miss, "turn the SDK's retries off: option.WithMaxRetries(0)")
	}
	if !maxTokens {
		miss = append(miss, "set max_tokens (MaxTokens or MaxCompletionTokens)")
	}
	if !bounded {
		miss = append(miss, "bound its wait: a context deadline or transport.WithMaxWait")
	}
	return miss
}

// selector returns "pkg.Name" for a call's function pkg.Name, "" otherwise.
func selector(fun ast.Expr) string {
	s, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	x, ok := s.X.(*ast.Ident)
	if !ok {
		return ""
	}
	return x.Name + "." + s.Sel.Name
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
