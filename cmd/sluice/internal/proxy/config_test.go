package proxy

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const goodConfig = `# a fleet's proxy
listen: 127.0.0.1:8081
admin: off
redis:
  url: ${REDIS_URL}
max_wait: 30s
max_body_bytes: 1048576
routes:
  - prefix: /openai
    upstream: https://api.openai.com
    limits:
      requests: 500/min
      tokens: 30000/min
    models:
      gpt-4.1-mini:
        requests: 500/min
        tokens: ${MINI_TPM:-200000}/min
  - prefix: /anthropic
    upstream: https://api.anthropic.com
    preset: anthropic
    limits:
      requests: 50/min
      input_tokens: 30000/min
      output_tokens: 8000/min burst 4000
`

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// TestLoadReadsEveryField: a full configuration, ${VAR} and
// ${VAR:-default} expanded in its values.
func TestLoadReadsEveryField(t *testing.T) {
	c, err := parse("proxy.yaml", []byte(goodConfig), env(map[string]string{"REDIS_URL": "redis://10.0.0.1:6379/2"}))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8081", c.Listen)
	assert.Equal(t, "off", c.Admin)
	assert.Equal(t, "redis://10.0.0.1:6379/2", c.Redis.URL)
	assert.Equal(t, 30*time.Second, c.MaxWait)
	assert.Equal(t, int64(1<<20), c.MaxBodyBytes)
	assert.Equal(t, defaultDrain, c.DrainTimeout, "a default")
	require.Len(t, c.Routes, 2)
	assert.Equal(t, presetOpenAI, c.Routes[0].Preset, "the default preset")
	assert.Equal(t, "200000/min", c.Routes[0].Models["gpt-4.1-mini"].Tokens)
	assert.Equal(t, "8000/min burst 4000", c.Routes[1].Limits.OutputTokens)
}

// TestConfigErrorsNameFileLineAndField: each mistake is refused with the
// file, the line and the field it is on.
func TestConfigErrorsNameFileLineAndField(t *testing.T) {
	set := env(map[string]string{"REDIS_URL": "redis://localhost:6379"})
	for _, tc := range []struct {
		name, from, to, want string
		env                  func(string) (string, bool)
	}{
		{"limit out of range", "tokens: 30000/min\n", "tokens: 0/min\n",
			`sluice: config proxy.yaml:13: routes[0].limits.tokens: "0/min" is out of range: rate must be a number from 1e-06 to 1e+09 per second`, set},
		{"limit above the range", "requests: 50/min", "requests: 2000000000/s",
			`sluice: config proxy.yaml:22: routes[1].limits.requests: "2000000000/s" is out of range: rate must be a number from 1e-06 to 1e+09 per second`, set},
		{"burst out of range", "burst 4000", "burst 2000000000",
			`sluice: config proxy.yaml:24: routes[1].limits.output_tokens: "8000/min burst 2000000000" is out of range: burst must be a number from 1e-06 to 1e+09`, set},
		{"a dimension the preset does not charge", "      input_tokens: 30000/min", "      tokens: 30000/min",
			`sluice: config proxy.yaml:23: routes[1].limits.tokens: the anthropic preset charges no tokens: the limit would never be reached`, set},
		{"unknown field", "max_wait: 30s", "max_wiat: 30s",
			`sluice: config proxy.yaml:6: max_wiat: no such field`, set},
		{"unknown field in a model", "        requests: 500/min\n        tokens: ${", "        rpm: 500/min\n        tokens: ${",
			`sluice: config proxy.yaml:16: routes[0].models.gpt-4.1-mini.rpm: no such field`, set},
		{"environment variable not set", "", "", `sluice: config proxy.yaml:5: ${REDIS_URL} is not set in the environment`, env(nil)},
		{"not a limit", "requests: 500/min", "requests: 500",
			`sluice: config proxy.yaml:12: routes[0].limits.requests: "500" is not a limit: want N/s, N/min or N/h, and optionally " burst B"`, set},
		{"bad preset", "preset: anthropic", "preset: claude",
			`sluice: config proxy.yaml:20: routes[1].preset: must be openai, anthropic, gemini or generic`, set},
		{"bad upstream", "upstream: https://api.openai.com", "upstream: api.openai.com",
			`sluice: config proxy.yaml:10: routes[0].upstream: must be an http:// or https:// URL with a host`, set},
		{"bad redis url", "url: ${REDIS_URL}", "url: localhost:6379",
			`sluice: config proxy.yaml:5: redis.url: not a redis:// or rediss:// URL`, set},
		{"negative max wait", "max_wait: 30s", "max_wait: -1s",
			`sluice: config proxy.yaml:6: max_wait: must be from 0 to 24h0m0s`, set},
		{"not a duration", "max_wait: 30s", "max_wait: soon",
			"sluice: config proxy.yaml: yaml: unmarshal errors:\n  line 6: cannot unmarshal !!str `soon` into time.Duration", set},
		{"duplicate prefix", "prefix: /anthropic", "prefix: /openai/",
			`sluice: config proxy.yaml:18: routes[1].prefix: prefix "/openai/" is another route's too`, set},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(replaceOnce(t, goodConfig, tc.from, tc.to))
			_, err := parse("proxy.yaml", data, tc.env)
			require.Error(t, err)
			assert.Equal(t, tc.want, err.Error())
		})
	}
}

func replaceOnce(t *testing.T, s, from, to string) string {
	t.Helper()
	if from == "" {
		return s
	}
	i := indexOnce(s, from)
	require.GreaterOrEqual(t, i, 0, "%q not in the config", from)
	return s[:i] + to + s[i+len(from):]
}

func indexOnce(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestLoadReadsTheFile: Load names the file it read in its errors.
func TestLoadReadsTheFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	require.NoError(t, os.WriteFile(file, []byte("routes: []\n"), 0o600))
	_, err := Load(file)
	var fe *FieldError
	require.True(t, errors.As(err, &fe), "%v", err)
	assert.Equal(t, file+":1", fe.Where)
	assert.Equal(t, "routes", fe.Field)
	_, err = Load(filepath.Join(t.TempDir(), "missing.yaml"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestEnvironmentValueStaysOneScalar: a variable whose value looks like
// YAML structure does not change the document's shape.
func TestEnvironmentValueStaysOneScalar(t *testing.T) {
	_, err := parse("proxy.yaml", []byte(goodConfig), env(map[string]string{"REDIS_URL": "x\nadmin: 0.0.0.0:1"}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "proxy.yaml:5: redis.url: not a redis:// or rediss:// URL")
}
