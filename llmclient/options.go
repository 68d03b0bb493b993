package llmclient

import (
	"net/http"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// Option configures a Client.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	bucket    bucket.Bucket // nil: a Local of rpm and tpm
	rpm, tpm  float64
	key       func(*http.Request) string
	estimator Estimator
	http      *http.Client
	transport []transport.Option
	maxRead   int64
}

// Default limits of the bucket a Client makes for itself: OpenAI's first
// usage tier for its mainstream models.
const (
	defaultRPM = 500
	defaultTPM = 30_000
)

// defaultMaxRead is the default of WithMaxResponseBytes: a completion of
// the largest models' output (128k tokens, some 512 KiB of text) fits many
// times over, JSON escapes, logprobs and many choices included; a body
// past it is an upstream gone wrong, not an answer to hold in memory.
const defaultMaxRead = 16 << 20

func newConfig(opts []Option) config {
	c := config{
		rpm:     defaultRPM,
		tpm:     defaultTPM,
		key:     ModelKey,
		http:    &http.Client{},
		maxRead: defaultMaxRead,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.bucket == nil {
		c.bucket = bucket.NewLocal(bucket.PerMinute(c.rpm),
			bucket.WithLimit(bucket.Tokens, bucket.PerMinute(c.tpm)))
	}
	return c
}

// WithBucket makes the Client charge its calls to b, which may be shared
// with other clients and processes (bucket.NewRedis). b must limit the
// bucket.Tokens dimension as well as bucket.Requests to enforce a TPM. By
// default the Client has a bucket of its own, in this process: a
// bucket.Local of the limits WithLimits sets.
func WithBucket(b bucket.Bucket) Option {
	return optionFunc(func(c *config) {
		if b != nil {
			c.bucket = b
		}
	})
}

// WithLimits sets the limits of the Client's own bucket: rpm requests and
// tpm tokens per minute, each also the burst. A value <= 0 keeps its
// default, 500 requests and 30,000 tokens per minute. Ignored with
// WithBucket. The rate limit headers of the provider's responses adjust the
// bucket as well (bucket.Bucket's Observe).
func WithLimits(rpm, tpm float64) Option {
	return optionFunc(func(c *config) {
		if rpm > 0 {
			c.rpm = rpm
		}
		if tpm > 0 {
			c.tpm = tpm
		}
	})
}

// WithKey sets the bucket key a call is charged to. The default is
// ModelKey: the base URL's scheme and host, a hash of the API key (never
// the key itself) or the organisation, and the model.
func WithKey(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.key = f
		}
	})
}

// WithEstimator sets how many tokens a call is charged before it is sent;
// the default is Estimate.
func WithEstimator(e Estimator) Option {
	return optionFunc(func(c *config) {
		if e != nil {
			c.estimator = e
		}
	})
}

// WithHTTPClient sends the calls through a copy of hc whose Transport is
// sluice's over hc's (nil: http.DefaultTransport). hc's Timeout, if any,
// bounds each call, waits and streams included. The default is a client
// with no timeout: give calls a context with a deadline.
func WithHTTPClient(hc *http.Client) Option {
	return optionFunc(func(c *config) {
		if hc != nil {
			c.http = hc
		}
	})
}

// WithTransportOptions passes opts to the transport.Transport the Client
// sends through, after its own (WithBucket, WithKey, WithCost, WithUsage),
// which they override: for instance transport.WithRetry,
// transport.WithBreaker, transport.WithMaxWait or transport.WithLogger.
func WithTransportOptions(opts ...transport.Option) Option {
	return optionFunc(func(c *config) { c.transport = append(c.transport, opts...) })
}

// WithMaxResponseBytes bounds what the Client reads of one response: the
// body of a Chat completion, or one event of a ChatStream (a line or the
// data of an event). A response past it fails with a *TooLargeError. n <= 0
// keeps the default, 16 MiB.
func WithMaxResponseBytes(n int64) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxRead = n
		}
	})
}
