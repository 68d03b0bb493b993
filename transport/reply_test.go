package transport_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// onePassBody is a response body that records how it is read: bytes and
// Read calls, and any Read after it said EOF.
type onePassBody struct {
	r                  *strings.Reader
	mu                 sync.Mutex
	read, calls        int
	afterEOF, gaveEOF  bool
	closed, closedOnce bool
}

func (b *onePassBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	if b.gaveEOF {
		b.afterEOF = true
	}
	n, err := b.r.Read(p)
	b.read += n
	b.gaveEOF = err == io.EOF
	return n, err
}

func (b *onePassBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closedOnce = !b.closed
	b.closed = true
	return nil
}

// observing is a Bucket that records the feedback it is told.
type observing struct {
	bucket.Bucket
	mu  sync.Mutex
	fbs []adaptive.Feedback
}

func (o *observing) Observe(ctx context.Context, key string, fb adaptive.Feedback) error {
	o.mu.Lock()
	o.fbs = append(o.fbs, fb)
	o.mu.Unlock()
	return o.Bucket.Observe(ctx, key, fb)
}

// TestResponseReadOnce: each attempt's response is read in one pass, and
// what the Transport does about it (the pause, the bucket's Observe, the
// retry and its delay) all follows from that one reading: a refusal whose
// header asks for no wait and whose body asks for 2s pauses its key for
// 2s and is retried after 2s (not at once, and not 2s more for the
// pause), a 503 whose body alone gives 3s likewise, and a spent quota is
// returned. Each body is read once,
// ahead of the rest, never again from the connection, and handed back whole.
func TestResponseReadOnce(t *testing.T) {
	replies := []struct {
		status int
		header http.Header
		body   string
	}{
		{429, http.Header{"Retry-After": {"0"}}, `{"error":{"message":"Please try again in 2s."}}`},
		{503, nil, geminiRetryInfo},
		{429, nil, quotaBody},
	}
	var bodies []*onePassBody
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		rp := replies[len(bodies)]
		b := &onePassBody{r: strings.NewReader(rp.body)}
		bodies = append(bodies, b)
		return &http.Response{StatusCode: rp.status, Header: rp.header, Body: b, Request: r}, nil
	})
	clk := newFakeClock()
	obs := &observing{Bucket: bucket.NewLocal(bucket.PerSecond(100), bucket.WithClock(clk))}
	tr := transport.New(base, transport.WithBucket(obs), transport.WithTestClock(clk.Now, clk.Sleep), noJitter)
	req, err := http.NewRequest("POST", "http://api.example/v1/chat", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())

	assert.Equal(t, 429, resp.StatusCode)
	assert.Equal(t, quotaBody, string(got), "handed back whole")
	require.Len(t, bodies, 3)
	for i, b := range bodies {
		assert.Equal(t, len(replies[i].body), b.read, "body %d: every byte read from the connection once", i)
		assert.False(t, b.afterEOF, "body %d: not read again after its end", i)
		assert.True(t, b.closed && b.closedOnce, "body %d: closed", i)
	}
	assert.Equal(t, []time.Duration{2 * time.Second, 3 * time.Second}, clk.Sleeps(),
		"each retry after the delay asked, which serves the key's pause")
	require.Len(t, obs.fbs, 3, "one Observe per response")
	assert.Equal(t, []adaptive.Class{adaptive.RateLimited, adaptive.Overloaded, adaptive.QuotaExhausted},
		[]adaptive.Class{obs.fbs[0].Class, obs.fbs[1].Class, obs.fbs[2].Class})
	assert.Equal(t, []time.Duration{2 * time.Second, 3 * time.Second, 0},
		[]time.Duration{obs.fbs[0].RetryAfter, obs.fbs[1].RetryAfter, obs.fbs[2].RetryAfter})
}

// TestResponseParsedOnlyInRead: what reads a response (its status line
// aside) is called in one place, the function read, which returns the
// reply that observe and Retry.decide take instead of the response; and
// no header that adaptive reads is read here by name: no response is
// parsed twice, nor a decision made from a second reading.
// The calls are found in the package's source, as go/build's deps_test
// finds imports.
func TestResponseParsedOnlyInRead(t *testing.T) {
	readers := map[string]bool{ // package.function
		"adaptive.Parse": true, "adaptive.Read": true, "adaptive.RetryAfter": true, "adaptive.ParseBody": true,
		"peek.Response": true,
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	found := map[string][]string{} // reader or header name -> the functions using it
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && readers[x.Name+"."+n.Sel.Name] {
						found[x.Name+"."+n.Sel.Name] = append(found[x.Name+"."+n.Sel.Name], fn.Name.Name)
					}
				case *ast.BasicLit:
					s, err := strconv.Unquote(n.Value)
					if err != nil {
						break
					}
					for _, h := range []string{"X-Should-Retry", "Retry-After", "Retry-After-Ms"} {
						if strings.EqualFold(s, h) {
							found[h] = append(found[h], fn.Name.Name)
						}
					}
				}
				return true
			})
		}
	}
	assert.Equal(t, map[string][]string{
		"adaptive.Parse":      {"read"},
		"adaptive.RetryAfter": {"read"},
		"adaptive.ParseBody":  {"read"},
		"peek.Response":       {"read"},
		"X-Should-Retry":      {"read"},
	}, found)
}
