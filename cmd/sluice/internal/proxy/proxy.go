package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// Proxy is the data plane: an http.Handler that sends each request to its
// route's upstream through the route's sluice Transport. Proxy is safe for
// concurrent use.
type Proxy struct {
	routes       []*route // longest prefix first
	maxBody      int64
	writeTimeout time.Duration
	log          *slog.Logger
	quota        *quota
	base         *http.Transport
}

// route is one Route, ready to serve.
type route struct {
	prefix   string // without its trailing "/": "" for the root
	name     string // as configured, for logs
	upstream *url.URL
	shape    shape
	bucket   bucket.Bucket // nil: the route limits nothing
	rp       *httputil.ReverseProxy
}

// New returns the Proxy of c (Load's, or defaults applied and validated),
// its metrics recorded through mp (nil: none), logging to log.
func New(c Config, mp metric.MeterProvider, log *slog.Logger) (*Proxy, error) {
	c, err := Check(c)
	if err != nil {
		return nil, err
	}
	q, err := newQuota(c, mp, log)
	if err != nil {
		return nil, err
	}
	p := &Proxy{maxBody: c.MaxBodyBytes, writeTimeout: c.WriteTimeout, log: log, quota: q, base: newBase()}
	pool := &bufferPool{}
	for _, rc := range c.Routes {
		r := &route{prefix: normPrefix(rc.Prefix), name: rc.Prefix, upstream: upstreamURL(rc.Upstream),
			shape: shapeOf(rc.Preset), bucket: q.routeBucket(rc)}
		tr := transport.New(timed{p.base},
			presetOptions(rc.Preset, r.bucket),
			transport.WithMaxWait(c.MaxWait),
			transport.WithMeterProvider(mp),
			transport.WithMetricAttributes(attribute.String("route", rc.Prefix)),
			transport.WithLogger(log),
		)
		r.rp = &httputil.ReverseProxy{
			Rewrite:        r.rewrite,
			Transport:      tr,
			BufferPool:     pool,
			ModifyResponse: p.modifyResponse,
			ErrorHandler:   p.errorHandler(r),
			ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		}
		p.routes = append(p.routes, r)
	}
	sort.SliceStable(p.routes, func(i, j int) bool { return len(p.routes[i].prefix) > len(p.routes[j].prefix) })
	return p, nil
}

// newBase is the HTTP transport to the upstreams: http.DefaultTransport's
// settings, with connections kept for a fleet's concurrency.
func newBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 1024
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return t
}

// Close closes the idle upstream connections and the Redis client.
func (p *Proxy) Close() {
	p.base.CloseIdleConnections()
	p.quota.close()
}

// match returns the route of path, nil if none.
func (p *Proxy) match(path string) *route {
	for _, r := range p.routes {
		if r.prefix == "" || path == r.prefix || strings.HasPrefix(path, r.prefix+"/") {
			return r
		}
	}
	return nil
}

// exchange is what the proxy keeps of one request while it is served,
// in its context.
type exchange struct {
	start time.Time
	// upstream is the time spent in the upstream's round trips (to their
	// headers): what the call did not spend waiting for the quota. The
	// Transport makes its attempts in the handler's goroutine, one after
	// another.
	upstream time.Duration
	rc       *http.ResponseController
	status   int
}

type exchangeKey struct{}

func exchangeOf(ctx context.Context) *exchange {
	ex, _ := ctx.Value(exchangeKey{}).(*exchange)
	return ex
}

// waited is how long the call has spent in sluice (the bucket, pauses,
// retries' delays) rather than at the upstream, in milliseconds.
func (ex *exchange) waited() string {
	d := max(time.Since(ex.start)-ex.upstream, 0)
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt := p.match(r.URL.Path)
	if rt == nil {
		apiError{http.StatusNotFound, kindNotFound, "sluice: no route for " + r.URL.Path}.
			write(w, shapeOfPath(r.URL.Path), 0)
		p.logRequest(r, nil, http.StatusNotFound, time.Now())
		return
	}
	start := time.Now()
	if status, err := p.buffer(w, r); err != nil {
		kind := kindInvalid
		if status == http.StatusRequestEntityTooLarge {
			kind = kindTooLarge
		}
		apiError{status, kind, err.Error()}.write(w, rt.shape, -1)
		p.logRequest(r, rt, status, start)
		return
	}
	ex := &exchange{start: time.Now(), rc: http.NewResponseController(w)}
	// No write deadline until the response comes (see modifyResponse):
	// the quota's wait is bounded by the max wait, the upstream's by the
	// client. The server sets none (WriteTimeout is 0), and clears the one
	// a response set once it is done.
	rt.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, ex)))
	p.logRequest(r, rt, ex.status, start)
}

// growAhead is the most of a request body's declared length the proxy
// makes room for before it arrives.
const growAhead = 1 << 20

// buffer reads r's body, at most p.maxBody bytes, into memory, so that the
// Transport can replay it (GetBody) and the presets read its model and
// cost. It returns the status to answer if it cannot.
func (p *Proxy) buffer(w http.ResponseWriter, r *http.Request) (int, error) {
	tooLarge := fmt.Errorf("sluice: the request body is larger than the proxy's cap of %d bytes", p.maxBody)
	if r.ContentLength > p.maxBody {
		return http.StatusRequestEntityTooLarge, tooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return 0, nil
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// What the client says it sends, but not ahead of what it sends:
		// a client that declares the cap and trickles holds no more.
		buf.Grow(int(min(r.ContentLength, growAhead)))
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, p.maxBody))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, tooLarge
	case err != nil:
		return http.StatusBadRequest, errors.New("sluice: reading the request body: " + err.Error())
	}
	body := buf.Bytes()
	r.ContentLength = int64(len(body))
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		r.Body, r.GetBody = http.NoBody, nil
	}
	return 0, nil
}

// rewrite sends pr to r's upstream: the path after r's prefix appended to
// the upstream's, the query as it is, the client's headers as they are
// but for Accept-Encoding (the proxy asks for gzip itself and hands the
// client the body decoded, so that the usage in it can be read) and the
// hop-by-hop headers.
func (r *route) rewrite(pr *httputil.ProxyRequest) {
	rest := strings.TrimPrefix(pr.In.URL.EscapedPath(), r.prefix)
	escaped := strings.TrimSuffix(r.upstream.EscapedPath(), "/") + rest
	out := pr.Out.URL
	out.Scheme, out.Host = r.upstream.Scheme, r.upstream.Host
	out.Path, _ = url.PathUnescape(escaped)
	out.RawPath = escaped
	if out.EscapedPath() == out.Path {
		out.RawPath = ""
	}
	pr.Out.Host = ""
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v, ok := pr.In.Header[h]; ok {
			pr.Out.Header[h] = v
		}
	}
	pr.Out.Header.Del("Accept-Encoding")
}

// modifyResponse adds x-sluice-wait-ms to the response, and sets the
// write deadline of its body: none for a stream.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	ex := exchangeOf(resp.Request.Context())
	if ex == nil {
		return nil
	}
	resp.Header.Set("X-Sluice-Wait-Ms", ex.waited())
	ex.status = resp.StatusCode
	if p.writeTimeout > 0 && !streaming(resp) {
		ex.rc.SetWriteDeadline(time.Now().Add(p.writeTimeout))
	}
	return nil
}

// streaming reports whether resp's body is a stream: server-sent events,
// newline-delimited JSON, or a body of unknown length.
func streaming(resp *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "text/event-stream" || mt == "application/x-ndjson" || resp.ContentLength < 0
}

// errorHandler answers a request the Transport returned no response for,
// in r's provider's shape: 429 if its wait would pass the max wait (with
// the time to come back), 503 if the quota is unavailable, 502 if the
// upstream could not be reached.
func (p *Proxy) errorHandler(r *route) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, req *http.Request, err error) {
		ex := exchangeOf(req.Context())
		if ex != nil {
			w.Header().Set("X-Sluice-Wait-Ms", ex.waited())
		}
		status, retry, e := classify(req.Context(), err)
		if ex != nil {
			ex.status = status
		}
		if status == 0 {
			return // the client has gone: nobody to answer
		}
		e.write(w, r.shape, retry)
		p.log.LogAttrs(req.Context(), slog.LevelDebug, "sluice: request failed",
			slog.String("route", r.name), slog.Int("status", status), slog.String("err", e.msg))
	}
}

// classify maps a Transport's error to the status, the retry and the
// error that answer it; status 0 if the client has gone.
func classify(ctx context.Context, err error) (int, time.Duration, apiError) {
	var we *bucket.WaitError
	var be *transport.BreakerError
	switch {
	case ctx.Err() != nil:
		return 0, 0, apiError{}
	case errors.As(err, &we):
		return http.StatusTooManyRequests, max(we.RetryAfter, time.Millisecond), apiError{http.StatusTooManyRequests, kindRateLimit,
			fmt.Sprintf("sluice: the fleet's quota has no room for this request within the proxy's max wait of %v; retry in %v",
				we.MaxWait.Round(time.Millisecond), we.RetryAfter.Round(time.Millisecond))}
	case errors.Is(err, bucket.ErrExceedsBurst):
		return http.StatusTooManyRequests, -1, apiError{http.StatusTooManyRequests, kindRateLimit,
			"sluice: the request costs more than the limit's burst and can never be admitted: lower max_tokens"}
	case errors.Is(err, bucket.ErrUnavailable):
		return http.StatusServiceUnavailable, time.Second, apiError{http.StatusServiceUnavailable, kindUnavailable,
			"sluice: the fleet's quota store is unavailable"}
	case errors.Is(err, bucket.ErrMisconfigured):
		return http.StatusServiceUnavailable, -1, apiError{http.StatusServiceUnavailable, kindUnavailable,
			"sluice: the fleet's quota store is misconfigured; see the proxy's log"}
	case errors.As(err, &be):
		return http.StatusServiceUnavailable, time.Second, apiError{http.StatusServiceUnavailable,
			kindUnavailable, "sluice: the upstream's circuit breaker is open"}
	}
	return http.StatusBadGateway, 0, apiError{http.StatusBadGateway, kindUpstream, "sluice: upstream unreachable"}
}

// logRequest logs a request served, at info level: its method, its path
// without the query, its route, status and time. Never a header.
func (p *Proxy) logRequest(r *http.Request, rt *route, status int, start time.Time) {
	if !p.log.Enabled(r.Context(), slog.LevelInfo) {
		return
	}
	name := ""
	if rt != nil {
		name = rt.name
	}
	p.log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("method", r.Method),
		slog.String("path", r.URL.Path), slog.String("route", name), slog.Int("status", status),
		slog.Duration("duration", time.Since(start)))
}

// timed is the upstream RoundTripper, adding each round trip's time to
// its request's exchange.
type timed struct{ base http.RoundTripper }

func (t timed) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.base.RoundTrip(r)
	if ex := exchangeOf(r.Context()); ex != nil {
		ex.upstream += time.Since(start)
	}
	return resp, err
}

// bufferPool lends the ReverseProxy its copy buffers: 1,000 streams share
// a few rather than allocate 32 KiB each.
type bufferPool struct{ p sync.Pool }

const copyBuffer = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBuffer)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }
