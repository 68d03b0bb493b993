package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/transport"
)

// redisURL parses a single server's URL, redis:// or rediss://.
func redisURL(s string) (*redis.Options, error) {
	o, err := redis.ParseURL(s)
	if err != nil {
		return nil, errors.New("not a redis:// or rediss:// URL")
	}
	return o, nil
}

// newRedis returns the client rc describes, nil if it names no Redis.
func newRedis(rc RedisConfig) (redis.UniversalClient, error) {
	switch {
	case rc.URL != "":
		o, err := redisURL(rc.URL)
		if err != nil {
			return nil, err
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClient(o), nil
	case len(rc.Addrs) > 0:
		return redis.NewUniversalClient(&redis.UniversalOptions{
			Addrs: rc.Addrs, MasterName: rc.MasterName, Username: rc.Username, Password: rc.Password,
			ContextTimeoutEnabled: true,
		}), nil
	}
	return nil, nil
}

// quota builds the buckets of the routes: Redis ones if rdb is not nil,
// Local ones otherwise.
type quota struct {
	rdb    redis.UniversalClient
	opts   []bucket.Option // every bucket's
	shared []*bucket.Redis // to probe for readiness
}

// routeBucket returns the bucket of route r: its default limits, and its
// models' own (bucket.Route by llmclient.KeyModel); nil if r limits nothing.
func (q *quota) routeBucket(r Route) bucket.Bucket {
	if r.Limits.empty() && len(r.Models) == 0 {
		return nil
	}
	def := q.limitsBucket(r.Limits, attribute.String("route", r.Prefix), attribute.String("model", "*"))
	if len(r.Models) == 0 {
		return def
	}
	models := make(map[string]bucket.Bucket, len(r.Models))
	for m, l := range r.Models {
		models[m] = q.limitsBucket(l, attribute.String("route", r.Prefix), attribute.String("model", m))
	}
	return bucket.Route(llmclient.KeyModel, models, def)
}

// limitsBucket returns a bucket limited by l (validated: parseLimit does
// not fail), with attrs on its metrics. Without a limit on requests, it
// limits them to the most a bucket allows: the other dimensions limit.
func (q *quota) limitsBucket(l Limits, attrs ...attribute.KeyValue) bucket.Bucket {
	requests := bucket.Limit{Rate: 1e9, Burst: 1e9}
	opts := append([]bucket.Option{bucket.WithMetricAttributes(attrs...)}, q.opts...)
	for _, f := range l.fields() {
		if f.value == "" {
			continue
		}
		lim, _ := parseLimit(f.value)
		if f.dim == bucket.Requests {
			requests = lim
			continue
		}
		opts = append(opts, bucket.WithLimit(f.dim, lim))
	}
	if q.rdb == nil {
		return bucket.NewLocal(requests, opts...)
	}
	b := bucket.NewRedis(q.rdb, requests, opts...)
	q.shared = append(q.shared, b)
	return b
}

// presetOptions returns the transport options of preset over b.
func presetOptions(preset string, b bucket.Bucket) transport.Option {
	if b == nil {
		return nil
	}
	switch preset {
	case presetAnthropic:
		return llmclient.Anthropic(b)
	case presetGemini:
		return transport.Options(transport.WithBucket(b), transport.WithKey(geminiKey))
	case presetGeneric:
		return transport.Options(transport.WithBucket(b), transport.WithKey(transport.CredentialKey))
	}
	return llmclient.OpenAI(b)
}

// geminiKey keys a Gemini request as llmclient.ModelKey keys OpenAI's: by
// the API key (its header, or the key parameter of the query) and the
// model, which Gemini names in the path (/v1beta/models/NAME:generateContent).
func geminiKey(r *http.Request) string {
	key := transport.CredentialKey(r)
	if key == transport.HostKey(r) {
		if k := r.URL.Query().Get("key"); k != "" {
			key += "#" + transport.Fingerprint(k)
		}
	}
	if _, rest, ok := strings.Cut(r.URL.Path, "/models/"); ok {
		model, _, _ := strings.Cut(rest, ":")
		if model != "" && len(model) <= 256 && !strings.ContainsAny(model, "/{}") {
			key += "/" + model
		}
	}
	return key
}

// newQuota returns the quota of c: on Redis if c names one.
func newQuota(c Config, mp metric.MeterProvider, log *slog.Logger) (*quota, error) {
	rdb, err := newRedis(c.Redis)
	if err != nil {
		return nil, err
	}
	q := &quota{rdb: rdb, opts: []bucket.Option{bucket.WithMeterProvider(mp)}}
	if rdb != nil {
		q.opts = append(q.opts, bucket.WithLogger(log))
		if c.Redis.FailClosed {
			q.opts = append(q.opts, bucket.WithFailClosed())
		}
	}
	return q, nil
}

// probeKey is the key the readiness probe reads: no request's.
const probeKey = "sluice-proxy-readiness"

// misconfigured asks every Redis bucket for a key's tokens and returns the
// first configuration error (bucket.ErrMisconfigured: an eviction policy,
// ACL, a read-only replica), nil if none: an unavailable Redis is a policy
// (fail open or closed), not a misconfiguration.
func (q *quota) misconfigured(ctx context.Context) error {
	for _, b := range q.shared {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := b.Tokens(cctx, probeKey)
		cancel()
		if errors.Is(err, bucket.ErrMisconfigured) {
			return err
		}
	}
	return nil
}

// close closes the Redis client, if any.
func (q *quota) close() {
	if q.rdb != nil {
		q.rdb.Close()
	}
}

// upstreamURL parses a route's upstream (validated).
func upstreamURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(fmt.Sprintf("proxy: upstream %q not validated: %v", s, err))
	}
	return u
}
