package llmclient_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/llmfixture"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

func TestModelKey(t *testing.T) {
	cred := "https://api.openai.com#" + transport.Fingerprint("sk-a")
	for _, c := range []struct {
		name, body, org string
		want            string
	}{
		{"model", `{"model":"gpt-4.1","messages":[]}`, "", cred + "/gpt-4.1"},
		{"model after the messages", `{"messages":[{"role":"user","content":"hi"}],"model":"gpt-4.1-mini"}`, "", cred + "/gpt-4.1-mini"},
		{"an organisation", `{"model":"gpt-4.1"}`, "org-123", "https://api.openai.com#org-123/gpt-4.1"},
		{"no model", `{"messages":[]}`, "", cred},
		{"null", `{"model":null}`, "", cred},
		{"not JSON", `model=gpt-4.1`, "", cred + "/" + llmclient.UnknownModel},
		{"a model that is not a string", `{"model":7}`, "", cred + "/" + llmclient.UnknownModel},
		{"a name too long to be a model's", `{"model":"` + strings.Repeat("m", 257) + `"}`, "", cred + "/" + llmclient.UnknownModel},
		{"past 8 MiB", `{"messages":[{"content":"` + strings.Repeat("x", 8<<20) + `"}],"model":"gpt-4.1"}`, "", cred + "/gpt-4.1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest("POST", "https://api.openai.com/v1/chat/completions", strings.NewReader(c.body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer sk-a")
			if c.org != "" {
				req.Header.Set("OpenAI-Organization", c.org)
			}
			assert.Equal(t, c.want, llmclient.ModelKey(req))
			body, err := io.ReadAll(req.Body)
			require.NoError(t, err)
			assert.Equal(t, c.body, string(body), "the body is left to send")
		})
	}
	req, err := http.NewRequest("GET", "https://api.openai.com/v1/models", nil)
	require.NoError(t, err)
	assert.Equal(t, "https://api.openai.com", llmclient.ModelKey(req), "no body, no credential: the host")
}

func FuzzModelKey(f *testing.F) {
	f.Add(`{"model":"gpt-4.1"}`)
	f.Add(`{"model":"a\u0000b","messages":[{"content":[]}]}`)
	f.Add(`[`)
	f.Fuzz(func(t *testing.T, body string) {
		req, err := http.NewRequest("POST", "https://h/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		key := llmclient.ModelKey(req)
		require.True(t, strings.HasPrefix(key, "https://h"), key)
		require.LessOrEqual(t, len(key), len("https://h/")+256)
	})
}

// TestPresets: one option wires a Transport for OpenAI or for Anthropic:
// each model on a key of its own, charged its estimate, reconciled with the
// usage the response reports.
func TestPresets(t *testing.T) {
	api := llmtest.NewServer(llmtest.Config{ReplyTokens: 5})
	defer api.Close()
	t.Run("OpenAI", func(t *testing.T) {
		b := bucket.NewLocal(bucket.PerMinute(100), bucket.WithLimit(bucket.Tokens, bucket.PerMinute(10_000)),
			bucket.WithClock(llmfixture.Frozen{}))
		tr := transport.New(nil, llmclient.OpenAI(b))
		hc := &http.Client{Transport: tr}
		for _, model := range []string{"gpt-4.1", "gpt-4.1-mini"} {
			req, err := http.NewRequest("POST", api.URL+"/chat/completions",
				strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"Say hello, please"}],"max_tokens":100}`))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer sk-a")
			resp, err := hc.Do(req)
			require.NoError(t, err)
			_, err = io.Copy(io.Discard, resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, 200, resp.StatusCode)
			key := strings.TrimSuffix(api.URL, "/v1") + "#" + transport.Fingerprint("sk-a") + "/" + model
			assert.Equal(t, 99.0, b.Tokens(key)[bucket.Requests], "%s: a key of its own", model)
			// "Say hello, please": 17 characters, 5 + 3 prompt tokens for
			// llmtest, 5 + 4 estimated: the estimate is reconciled to the
			// prompt, and the cap stays charged, as OpenAI counts it.
			assert.Equal(t, 10_000.0-8-100, b.Tokens(key)[bucket.Tokens], "%s: the prompt and the cap", model)
		}
		st := tr.Stats()
		assert.Equal(t, 2.0, st.Charged[bucket.Requests])
		assert.Equal(t, 2.0, st.Refunded[bucket.Tokens], "the prompt's estimate, one too many a call")
	})
	t.Run("Anthropic", func(t *testing.T) {
		srv := newRecorder(t, reply(200, `{"type":"message","usage":{"input_tokens":9,"output_tokens":3}}`,
			"Content-Type", "application/json"))
		b := bucket.NewLocal(bucket.PerMinute(50), bucket.WithLimit(bucket.InputTokens, bucket.PerMinute(30_000)),
			bucket.WithLimit(bucket.OutputTokens, bucket.PerMinute(8_000)), bucket.WithClock(llmfixture.Frozen{}))
		tr := transport.New(nil, llmclient.Anthropic(b), transport.WithMaxWait(time.Second))
		req, err := http.NewRequest("POST", srv.URL+"/v1/messages",
			strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":500,"messages":[{"role":"user","content":"Say hello, please"}]}`))
		require.NoError(t, err)
		req.Header.Set("X-Api-Key", "sk-ant")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		key := srv.URL + "#" + transport.Fingerprint("sk-ant") + "/claude-sonnet-4-5"
		assert.Equal(t, bucket.Cost{bucket.Requests: 49, bucket.InputTokens: 30_000 - 9, bucket.OutputTokens: 8_000 - 3}, b.Tokens(key))
	})
}

func TestKeyModel(t *testing.T) {
	for key, want := range map[string]string{
		"https://api.openai.com#0123456789ab/gpt-4.1":  "gpt-4.1",
		"https://api.openai.com#org-1/meta-llama/L3-8": "meta-llama/L3-8",
		"https://api.openai.com#0123456789ab":          "",
		"https://api.openai.com":                       "",
		"plain":                                        "",
	} {
		assert.Equal(t, want, llmclient.KeyModel(key), key)
	}
	req, err := http.NewRequest("POST", "https://h/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	require.NoError(t, err)
	req.Header.Set("OpenAI-Organization", "a/b")
	assert.Equal(t, "m", llmclient.KeyModel(llmclient.ModelKey(req)), "an organisation with a / is hashed")
}
