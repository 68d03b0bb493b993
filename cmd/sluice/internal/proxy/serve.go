package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// ErrDrainTimeout is returned by Serve when the drain timeout cut requests
// that were still open.
var ErrDrainTimeout = errors.New("sluice: the drain timeout cut open requests")

// Server is a Proxy served on its listeners, with its admin endpoints.
type Server struct {
	cfg      Config
	log      *slog.Logger
	proxy    *Proxy
	mp       *sdkmetric.MeterProvider
	reg      *prometheus.Registry
	draining atomic.Bool
	badRedis atomic.Pointer[string] // the misconfiguration found, nil if none
}

// NewServer returns the Server of c, checked (see Load): its buckets and
// transports are built, nothing is listened on yet.
func NewServer(c Config, log *slog.Logger) (*Server, error) {
	c = c.withDefaults()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("sluice: metrics: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	p, err := New(c, mp, log)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: c, log: log, proxy: p, mp: mp, reg: reg}, nil
}

// Serve serves s on ln (the routes) and admin (nil: none) until ctx is
// done, then drains: it stops accepting, lets open requests and streams
// finish within the drain timeout, and returns nil, or ErrDrainTimeout if
// it had to cut some. /readyz answers 503 from the start of the drain.
func (s *Server) Serve(ctx context.Context, ln, admin net.Listener) error {
	srv := &http.Server{
		Handler:           s.proxy,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	var adm *http.Server
	if admin != nil {
		adm = &http.Server{Handler: s.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go adm.Serve(admin)
	}
	probeCtx, stopProbe := context.WithCancel(context.Background())
	defer stopProbe()
	go s.probe(probeCtx)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s.log.Info("sluice proxy serving", slog.String("listen", ln.Addr().String()), slog.Int("routes", len(s.proxy.routes)))
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
	}
	s.draining.Store(true)
	s.log.Info("sluice proxy draining", slog.Duration("timeout", s.cfg.DrainTimeout))
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	if serr := srv.Shutdown(dctx); serr != nil {
		srv.Close()
		err = ErrDrainTimeout
	} else if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if adm != nil {
		adm.Close()
	}
	s.proxy.Close()
	s.mp.Shutdown(context.Background())
	s.log.Info("sluice proxy stopped", slog.Any("err", err))
	return err
}

// probeEvery is how often the readiness probe asks Redis.
const probeEvery = 2 * time.Second

// probe checks the Redis buckets for a misconfiguration until ctx is done.
func (s *Server) probe(ctx context.Context) {
	if len(s.proxy.quota.shared) == 0 {
		return
	}
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		if err := s.proxy.quota.misconfigured(ctx); err != nil {
			msg := err.Error()
			s.badRedis.Store(&msg)
		} else {
			s.badRedis.Store(nil)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// adminHandler serves /healthz (200 while the process runs), /readyz (503
// while draining or while Redis is misconfigured) and /metrics.
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch bad := s.badRedis.Load(); {
		case s.draining.Load():
			http.Error(w, "draining", http.StatusServiceUnavailable)
		case bad != nil:
			http.Error(w, "redis misconfigured: "+*bad, http.StatusServiceUnavailable)
		default:
			w.Write([]byte("ready\n"))
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	return mux
}
