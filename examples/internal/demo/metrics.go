package demo

import (
	"context"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Metrics serves the measurements of an OpenTelemetry MeterProvider for
// Prometheus: at URL, through the OpenTelemetry Prometheus exporter, from
// a registry of its own.
type Metrics struct {
	Provider metric.MeterProvider
	URL      string // http://host:port/metrics
	mp       *sdkmetric.MeterProvider
	srv      *http.Server
}

// ServeMetrics serves a new MeterProvider's measurements on ln at /metrics.
func ServeMetrics(ln net.Listener) (*Metrics, error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return &Metrics{Provider: mp, URL: "http://" + ln.Addr().String() + "/metrics", mp: mp, srv: srv}, nil
}

// Close stops serving.
func (m *Metrics) Close() {
	m.srv.Close()
	m.mp.Shutdown(context.Background())
}

// BucketFamilies are the Prometheus names of every metric a bucket
// records, as the OpenTelemetry exporter writes them: what the examples'
// tests look for in a scrape.
var BucketFamilies = []string{
	"sluice_bucket_decisions_total",
	"sluice_bucket_tokens_charged_total",
	"sluice_bucket_tokens_refunded_total",
	"sluice_bucket_tokens_debited_total",
	"sluice_bucket_wait_duration_seconds",
	"sluice_bucket_waiters",
	"sluice_bucket_rate_decreases_total",
	"sluice_bucket_pauses_total",
	"sluice_bucket_tokens_remaining",
	"sluice_bucket_rate_fraction_ratio",
	"sluice_bucket_redis_state",
	"sluice_bucket_redis_transitions_total",
	"sluice_bucket_members",
}

// Families returns the metric families of a Prometheus text exposition,
// with their types.
func Families(scrape string) map[string]string {
	out := map[string]string{}
	for line := range strings.Lines(scrape) {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = f[3]
		}
	}
	return out
}
