package transport_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/transport"
)

// credentialHeaders are the headers that carry secrets, each with a
// secret of its own.
var credentialHeaders = map[string]string{
	"Authorization":       "Bearer sk-authorization-secret",
	"Proxy-Authorization": "Basic proxy-secret",
	"Api-Key":             "azure-api-key-secret",
	"X-Api-Key":           "anthropic-x-api-key-secret",
	"X-Goog-Api-Key":      "goog-api-key-secret",
	"Cookie":              "session=cookie-secret",
}

// secretOf returns the secret part of a header value.
func secretOf(v string) string {
	if _, s, ok := strings.Cut(v, " "); ok {
		return s
	}
	return v
}

// TestSecretsNeverReachRedis: with CredentialKey, a Redis bucket's keys
// hold the API key's fingerprint, never the key, for every header that
// carries one; and 429s with Retry-After (Observe) write no secret either.
func TestSecretsNeverReachRedis(t *testing.T) {
	rdb := redistest.Client(t)
	prefix := fmt.Sprintf("secrets%d", time.Now().UnixNano())
	s := newScript(status(429, "Retry-After", "0"))
	defer s.Close()
	tr := transport.New(nil, transport.WithKey(transport.CredentialKey),
		transport.WithBucket(bucket.NewRedis(rdb, bucket.PerSecond(100), bucket.WithPrefix(prefix))))
	defer tr.CloseIdleConnections()
	for _, h := range []string{"Authorization", "Api-Key", "X-Api-Key", "X-Goog-Api-Key"} {
		req, err := http.NewRequest("POST", s.URL+"/v1/chat", strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set(h, credentialHeaders[h])
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	keys, err := rdb.Keys(context.Background(), prefix+":*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	all := strings.Join(keys, "\n")
	for h, v := range credentialHeaders {
		assert.NotContains(t, all, secretOf(v), h)
	}
	for _, h := range []string{"Authorization", "Api-Key", "X-Api-Key", "X-Goog-Api-Key"} {
		assert.Contains(t, all, transport.Fingerprint(secretOf(credentialHeaders[h])), "%s: the fingerprint names the bucket", h)
	}
	t.Log(all)
}

// TestSecretsNotInBucketFailures: when the bucket's Redis is unreachable,
// the errors, debug logs and metrics of requests carrying every kind of
// credential hold none of them, failing closed or open.
func TestSecretsNotInBucketFailures(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	defer rdb.Close()
	s := newScript()
	defer s.Close()
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	var errs []string
	for _, policy := range []bucket.Option{bucket.WithFailClosed(), bucket.WithFailOpen()} {
		tr := transport.New(nil, transport.WithKey(transport.CredentialKey), transport.WithLogger(logger),
			transport.WithMeterProvider(mp), transport.WithBucket(bucket.NewRedis(rdb, bucket.PerSecond(100), policy)))
		for range 2 { // a Redis error, then the open breaker
			req, err := http.NewRequest("POST", s.URL+"/v1/chat?key=query-secret", strings.NewReader("{}"))
			require.NoError(t, err)
			for h, v := range credentialHeaders {
				req.Header.Set(h, v)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			resp.Body.Close()
		}
		tr.CloseIdleConnections()
	}
	require.Len(t, errs, 2, "failing closed, both requests fail; failing open, none")
	for _, e := range errs {
		assert.Contains(t, e, " unavailable: ")
	}
	metrics := fmt.Sprint(collect(t, reader))
	for h, v := range credentialHeaders {
		for what, text := range map[string]string{"errors": strings.Join(errs, "\n"), "logs": logs.String(), "metrics": metrics} {
			assert.NotContains(t, text, secretOf(v), "%s in %s", h, what)
		}
	}
	assert.NotContains(t, logs.String(), "query-secret")
	t.Log(errs)
}
