package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// TestGeminiKeyNamesTheAPIKeyAndModel: a Gemini call is keyed by its API
// key, from its header or its key parameter, hashed, and by the model of
// its path.
func TestGeminiKeyNamesTheAPIKeyAndModel(t *testing.T) {
	const path = "https://generativelanguage.example/v1beta/models/gemini-2.0-flash:generateContent"
	byHeader := httptest.NewRequest(http.MethodPost, path, nil)
	byHeader.Header.Set("X-Goog-Api-Key", "AIza-secret")
	byQuery := httptest.NewRequest(http.MethodPost, path+"?key=AIza-secret", nil)
	want := "https://generativelanguage.example#" + transport.Fingerprint("AIza-secret") + "/gemini-2.0-flash"
	assert.Equal(t, want, geminiKey(byHeader))
	assert.Equal(t, want, geminiKey(byQuery))
	assert.NotContains(t, geminiKey(byQuery), "AIza-secret")
	other := httptest.NewRequest(http.MethodPost, "https://generativelanguage.example/v1beta/models/gemini-pro:streamGenerateContent?key=AIza-secret", nil)
	assert.NotEqual(t, want, geminiKey(other), "another model, another key")
}

// TestGeminiWaitPastMaxWaitAnswersInGeminisShape: a Gemini route's 429
// is a google.rpc.Status, RESOURCE_EXHAUSTED, with the retry headers.
func TestGeminiWaitPastMaxWaitAnswersInGeminisShape(t *testing.T) {
	srv := llmtest.NewServer(llmtest.Config{Gemini: true})
	defer srv.Close()
	c := oneRoute(srv.AnthropicURL, presetGemini, Limits{Requests: "1/min"})
	c.MaxWait = 100 * time.Millisecond
	p := start(t, c)
	const path = "/v1beta/models/gemini-2.0-flash:generateContent?key=AIza-secret"
	first := post(t, p.URL+path, `{"contents":[{"parts":[{"text":"Hi"}]}]}`)
	readAll(t, first)
	require.Equal(t, http.StatusOK, first.StatusCode)
	resp := post(t, p.URL+path, `{"contents":[{"parts":[{"text":"Hi"}]}]}`)
	raw := readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get("X-Should-Retry"))
	var b struct {
		Error struct {
			Code   int
			Status string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &b))
	assert.Equal(t, 429, b.Error.Code)
	assert.Equal(t, "RESOURCE_EXHAUSTED", b.Error.Status)
	assert.Equal(t, int64(1), srv.Stats().Accepted, "the upstream saw the first call only")
}
