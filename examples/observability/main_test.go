package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/examples/internal/demo"
)

// transportFamilies are the transport's.
var transportFamilies = []string{
	"sluice_transport_attempts_total",
	"sluice_transport_retries_total",
	"sluice_transport_wait_duration_seconds",
	"sluice_transport_breaker_state",
}

// TestScrapeAndDashboard runs the program, scrapes its metrics while its
// calls run, and checks that every bucket metric is there, that the
// dashboard queries only metrics the scrape has, and that it shows every
// one of them.
func TestScrapeAndDashboard(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready := make(chan string, 1)
	var out, errs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-duration", "0", "-workers", "8"}, &out, &errs, ready)
	}()
	var url string
	select {
	case url = <-ready:
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, errs.String())
	}

	// Scrape until every family is there (the gauges read Redis once the
	// first calls are made; a retry needs a 429), while the calls run.
	var families map[string]string
	var scrape string
	deadline := time.Now().Add(30 * time.Second)
	for {
		scrape = get(t, url)
		families = demo.Families(scrape)
		if missing := missingOf(families); len(missing) == 0 || time.Now().After(deadline) {
			assert.Empty(t, missing, "metrics missing from the scrape")
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	assert.Contains(t, scrape, `key="gpt-4.1-mini"`, "the key label: the model")
	assert.NotContains(t, scrape, "observability:", "no raw key")
	assert.Contains(t, scrape, `upstream="fake-openai"`)
	cancel()
	require.NoError(t, <-done, errs.String())
	assert.Contains(t, out.String(), "calls ok, 0 failed")

	raw, err := os.ReadFile("dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	name := regexp.MustCompile(`sluice_[a-z_]+`)
	used := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		assert.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			refs := name.FindAllString(tg.Expr, -1)
			assert.NotEmpty(t, refs, "%s: %s", p.Title, tg.Expr)
			for _, r := range refs {
				f := family(r, families)
				assert.Contains(t, families, f, "panel %q queries %s, which the program does not export", p.Title, r)
				if kind := families[f]; kind == "histogram" {
					assert.NotEqual(t, f, r, "panel %q: a histogram is queried by its _bucket, _sum or _count", p.Title)
				}
				used[f] = true
			}
		}
	}
	for f := range families {
		if strings.HasPrefix(f, "sluice_") {
			assert.True(t, used[f], "the dashboard shows no %s", f)
		}
	}
}

func get(t *testing.T, url string) string {
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	return string(b)
}

func missingOf(families map[string]string) []string {
	var missing []string
	for _, f := range slices.Concat(demo.BucketFamilies, transportFamilies) {
		if _, ok := families[f]; !ok {
			missing = append(missing, f)
		}
	}
	slices.Sort(missing)
	return missing
}

// family is the family that series name r belongs to: a histogram's
// _bucket, _sum and _count are its own.
func family(r string, families map[string]string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := strings.CutSuffix(r, suffix); ok && families[f] == "histogram" {
			return f
		}
	}
	return r
}
