// Package modgraph tests what a user's module requires by importing sluice.
package modgraph

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// heavy are the modules that only sluice's examples, its comparisons with
// other libraries, its tokenizer and its command use (the examples,
// compat, tiktoken and cmd/sluice modules): a module that imports sluice's
// packages must not have them in its graph. Each is a module path, or the prefix of the paths of a family
// of modules.
var heavy = []string{
	"gonum.org",
	"github.com/openai/openai-go",
	"github.com/hashicorp/go-retryablehttp",
	"github.com/go-redis/redis_rate",
	"golang.org/x/time",
	"github.com/alicebob/miniredis",
	"github.com/tiktoken-go/tokenizer", // about 10 MB of vocabularies
	"github.com/dlclark/regexp2",
	// The sluice command's (cmd/sluice): its Prometheus endpoint.
	"github.com/prometheus/client_golang",
	"go.opentelemetry.io/otel/exporters/prometheus",
}

// TestLeanGraph makes a module of its own that imports sluice's root
// package (its overview, doc.go), transport and bucket, as a user's would, with sluice replaced by this checkout, and
// checks that go mod graph, after go mod tidy, lists none of heavy.
func TestLeanGraph(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string]string{
		"main.go": "package main\n\nimport (\n\t_ \"github.com/sluicehq/sluice\"\n\t_ \"github.com/sluicehq/sluice/bucket\"\n" +
			"\t_ \"github.com/sluicehq/sluice/transport\"\n)\n\nfunc main() {}\n",
		"go.mod": "module lean\n\ngo 1.26.0\n\nrequire github.com/sluicehq/sluice v0.0.0\n\n" +
			"replace github.com/sluicehq/sluice => " + root + "\n",
		"go.sum": string(sum),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The module cache holds what the library's tests needed; what else
	// tidy reads comes through GOPROXY, as it would for a user.
	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				out = append(out, ee.Stderr...)
			}
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "tidy")
	graph := run("mod", "graph")
	if !strings.Contains(graph, "github.com/sluicehq/sluice@") {
		t.Fatalf("go mod graph does not list sluice:\n%s", graph)
	}
	for line := range strings.Lines(graph) {
		for _, node := range strings.Fields(line) {
			path, _, _ := strings.Cut(node, "@")
			for _, h := range heavy {
				if path == h || strings.HasPrefix(path, h+"/") {
					t.Errorf("go mod graph: %s", strings.TrimSpace(line))
				}
			}
		}
	}
}
