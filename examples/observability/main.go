// Observability shows what sluice reports about itself: it runs a small
// fleet in one process, calling a fake OpenAI-compatible API through
// llmclient with a Redis bucket, and serves the bucket's and the
// transport's metrics for Prometheus at http://<-listen>/metrics, through
// the OpenTelemetry Prometheus exporter. dashboard.json, beside this file,
// is a Grafana dashboard of every one of them (import it, and choose the
// Prometheus data source that scrapes this program).
//
// The fake API (llmclient/llmtest) holds a hidden limit of 20 requests and
// 6,000 tokens a second, with OpenAI's x-ratelimit-* headers. Two models
// are called, each on a key of its own configured at 15 requests and 4,500
// tokens a second: together 1.5 times what the API allows, so that the
// metrics show the adaptive law at work (429s, pauses, decreases, a rate
// fraction below 1) as well as the waits. The bucket labels its
// measurements with the model (bucket.WithMetricKeyLabel), never the key.
// With no -redis flag the program serves an embedded Redis (miniredis).
//
// Usage:
//
//	go run ./examples/observability [-listen 127.0.0.1:9464] [-duration 1m] [-workers 16] [-redis host:port]
//
// then, while it runs:
//
//	curl -s http://127.0.0.1:9464/metrics | grep ^sluice_
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/examples/internal/demo"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/llmclient/llmtest"
	"github.com/sluicehq/sluice/transport"
)

// models are the models called, each on a key of its own.
var models = []string{"gpt-4.1", "gpt-4.1-mini"}

const keyPrefix = "observability:"

func main() {
	redis.SetLogger(demo.QuietLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

// run runs the program with args. Once the metrics are served, it sends
// their URL on ready, if not nil.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("observability", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9464", "`address` to serve /metrics on")
	duration := fs.Duration("duration", time.Minute, "how long to run; 0: until interrupted")
	workers := fs.Int("workers", 16, "goroutines calling the API")
	redisAddr := fs.String("redis", "", "Redis URL or host:port; empty serves an embedded Redis")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *workers < 1 || *duration < 0 || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("invalid arguments")
	}
	// The workers stop starting calls at the end of the run; the calls
	// under way then run to their end.
	running := ctx
	if *duration > 0 {
		var cancel context.CancelFunc
		running, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	// The metrics: an OpenTelemetry MeterProvider whose reader is the
	// Prometheus exporter (examples/internal/demo/metrics.go).
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	metrics, err := demo.ServeMetrics(ln)
	if err != nil {
		ln.Close()
		return err
	}
	defer metrics.Close()
	mp, url := metrics.Provider, metrics.URL
	fmt.Fprintf(stdout, "observability: metrics at %s for %v\n", url, *duration)

	rdb, closeRedis, err := dial(*redisAddr)
	if err != nil {
		return err
	}
	defer closeRedis()

	api := llmtest.NewServer(llmtest.Config{
		Requests:     llmtest.TokenBucket(20, time.Second, 20),
		Tokens:       llmtest.TokenBucket(6000, time.Second, 6000),
		Headers:      llmtest.OpenAIHeaders,
		Latency:      100 * time.Millisecond,
		TokenLatency: time.Millisecond,
	})
	defer api.Close()

	upstream := attribute.String("upstream", "fake-openai")
	b := bucket.NewRedis(rdb, bucket.Limit{Rate: 15, Burst: 15},
		bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 4500, Burst: 4500}),
		bucket.WithMeterProvider(mp),
		bucket.WithMetricAttributes(upstream),
		bucket.WithMetricKeyLabel(func(key string) string { return strings.TrimPrefix(key, keyPrefix) }))
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for i, model := range models {
		client := llmclient.New(api.URL, "sk-observability",
			llmclient.WithBucket(b),
			llmclient.WithKey(func(*http.Request) string { return keyPrefix + model }),
			llmclient.WithTransportOptions(transport.WithMeterProvider(mp), transport.WithMetricAttributes(upstream),
				transport.WithBreaker(gobreaker.Settings{Name: model})))
		for w := range *workers / len(models) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for running.Err() == nil {
					if err := chat(ctx, client, model, rng); err == nil {
						ok.Add(1)
					} else if ctx.Err() == nil {
						if failed.Add(1) == 1 {
							fmt.Fprintln(stderr, "observability: a call failed:", err)
						}
					}
				}
			}()
		}
	}
	if ready != nil {
		ready <- url
	}
	wg.Wait()
	fmt.Fprintf(stdout, "observability: %d calls ok, %d failed; the API answered 429 %d times\n",
		ok.Load(), failed.Load(), api.Stats().Rejected)
	return nil
}

// chat makes one call of a random size.
func chat(ctx context.Context, c *llmclient.Client, model string, rng *rand.Rand) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := c.Chat(ctx, llmclient.ChatRequest{
		Model:     model,
		Messages:  []llmclient.Message{{Role: "user", Content: strings.Repeat("word ", 20+rng.IntN(400))}},
		MaxTokens: 16 + rng.IntN(112),
	})
	return err
}

// dial returns a client of the Redis at addr, or of an embedded one.
func dial(addr string) (redis.UniversalClient, func(), error) {
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, nil, err
		}
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		return rdb, func() { rdb.Close(); mr.Close() }, nil
	}
	u, err := demo.RedisURL(addr)
	if err != nil {
		return nil, nil, err
	}
	opt, _ := redis.ParseURL(u)
	rdb := redis.NewClient(opt)
	return rdb, func() { rdb.Close() }, nil
}
