// Command sluice is sluice's command line: sluice proxy serves LLM APIs to
// local clients through a fleet-wide quota, so that any language's
// official SDK, given the proxy as its base URL, waits for a slot of the
// fleet's limit instead of meeting a 429. See docs/proxy.md.
//
//	go install github.com/sluicehq/sluice/cmd/sluice@latest
//	sluice proxy --upstream https://api.openai.com --rpm 500 --tpm 30000 --redis redis://localhost:6379
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/sluicehq/sluice/cmd/sluice/internal/proxy"
)

const usage = `usage: sluice proxy [flags]

Quick start, one upstream:
  sluice proxy --upstream https://api.openai.com --rpm 500 --tpm 30000
  sluice proxy --upstream https://api.anthropic.com --preset anthropic --rpm 50 --itpm 30000 --otpm 8000
then point the SDK's base URL at http://127.0.0.1:8080 (OpenAI's: .../v1).

With a configuration file (routes, per-model limits; see docs/proxy.md):
  sluice proxy --config sluice.yaml

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run runs the command line args and returns the exit code: 0 when the
// proxy stopped after a complete drain, 1 if it failed or the drain
// timeout cut requests, 2 for a usage or configuration error.
func run(args []string, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "proxy" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cfg, level, err := parseFlags(args[1:], stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, err)
		}
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	srv, err := proxy.NewServer(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintln(stderr, "sluice:", err)
		return 1
	}
	var admin net.Listener
	if cfg.Admin != "off" {
		if admin, err = net.Listen("tcp", cfg.Admin); err != nil {
			fmt.Fprintln(stderr, "sluice:", err)
			return 1
		}
	}
	// The listeners' addresses, for whoever started the proxy on port 0.
	log.Info("sluice proxy listening", slog.String("addr", ln.Addr().String()), slog.String("admin", addrOf(admin)))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := srv.Serve(ctx, ln, admin); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// flagNames names the flag that sets a field of the quick start's
// configuration, for its errors.
var flagNames = map[string]string{
	"routes[0].upstream":             "--upstream",
	"routes[0].preset":               "--preset",
	"routes[0].prefix":               "--prefix",
	"routes[0].limits.requests":      "--rpm",
	"routes[0].limits.tokens":        "--tpm",
	"routes[0].limits.input_tokens":  "--itpm",
	"routes[0].limits.output_tokens": "--otpm",
	"redis.url":                      "--redis",
	"max_wait":                       "--max-wait",
	"max_body_bytes":                 "--max-body-bytes",
	"drain_timeout":                  "--drain-timeout",
	"write_timeout":                  "--write-timeout",
	"routes":                         "--upstream",
}

// parseFlags returns the configuration the flags describe: a file's
// (--config), the listen and admin flags overriding it, or the quick
// start's one route.
func parseFlags(args []string, stderr io.Writer) (proxy.Config, slog.Level, error) {
	fs := flag.NewFlagSet("sluice proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var (
		file     = fs.String("config", "", "YAML configuration `file` (see docs/proxy.md)")
		listen   = fs.String("listen", "", "address to serve on (default 127.0.0.1:8080)")
		admin    = fs.String("admin", "", "address of /healthz, /readyz, /metrics (default 127.0.0.1:9090; off: none)")
		upstream = fs.String("upstream", "", "the provider's base `URL`, e.g. https://api.openai.com")
		preset   = fs.String("preset", "openai", "openai, anthropic, gemini or generic")
		prefix   = fs.String("prefix", "/", "path prefix of the route")
		redisURL = fs.String("redis", "", "redis:// `URL` of the fleet's shared quota (none: this proxy's own, in memory)")
		rpm      = fs.Float64("rpm", 0, "requests per minute")
		tpm      = fs.Float64("tpm", 0, "tokens per minute (openai)")
		itpm     = fs.Float64("itpm", 0, "input tokens per minute (anthropic)")
		otpm     = fs.Float64("otpm", 0, "output tokens per minute (anthropic)")
		maxWait  = fs.Duration("max-wait", 0, "longest wait for the quota before a 429 (default 60s)")
		maxBody  = fs.Int64("max-body-bytes", 0, "largest request body (default 32 MiB)")
		drain    = fs.Duration("drain-timeout", 0, "time SIGTERM gives open requests (default 30s)")
		write    = fs.Duration("write-timeout", 0, "write deadline of a response that is not a stream (default 10m)")
		level    = fs.String("log-level", "info", "debug, info, warn or error")
	)
	if err := fs.Parse(args); err != nil {
		return proxy.Config{}, 0, err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return proxy.Config{}, 0, fmt.Errorf("sluice: --log-level: %w", err)
	}
	if fs.NArg() > 0 {
		return proxy.Config{}, 0, fmt.Errorf("sluice: unexpected argument %q", fs.Arg(0))
	}
	var c proxy.Config
	if *file != "" {
		var extra error
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "config", "listen", "admin", "log-level":
			default:
				extra = fmt.Errorf("sluice: --%s does not go with --config: set it in the file", f.Name)
			}
		})
		if extra != nil {
			return c, 0, extra
		}
		var err error
		if c, err = proxy.Load(*file); err != nil {
			return c, 0, err
		}
	} else {
		var err error
		c, err = quickStart(*upstream, *preset, *prefix, *redisURL, []float64{*rpm, *tpm, *itpm, *otpm})
		if err != nil {
			return c, 0, err
		}
		c.MaxWait, c.MaxBodyBytes, c.DrainTimeout, c.WriteTimeout = *maxWait, *maxBody, *drain, *write
	}
	if *listen != "" {
		c.Listen = *listen
	}
	if *admin != "" {
		c.Admin = *admin
	}
	checked, err := proxy.Check(c)
	var fe *proxy.FieldError
	if errors.As(err, &fe) && *file == "" {
		name := flagNames[fe.Field]
		if name == "" {
			name = fe.Field
		}
		return c, 0, fmt.Errorf("sluice: %s: %s", name, fe.Msg)
	}
	if err != nil {
		return c, 0, err
	}
	return checked, lvl, nil
}

// quickStart is the configuration of one route, "/" by default, to
// upstream, limited per minute by rpm, tpm, itpm and otpm (0: none).
func quickStart(upstream, preset, prefix, redisURL string, perMinute []float64) (proxy.Config, error) {
	var l [4]string
	for i, name := range []string{"--rpm", "--tpm", "--itpm", "--otpm"} {
		switch n := perMinute[i]; {
		case n < 0:
			return proxy.Config{}, fmt.Errorf("sluice: %s: %g is out of range: a limit must be positive", name, n)
		case n > 0:
			l[i] = strconv.FormatFloat(n, 'f', -1, 64) + "/min"
		}
	}
	return proxy.Config{
		Redis: proxy.RedisConfig{URL: redisURL},
		Routes: []proxy.Route{{Prefix: prefix, Upstream: upstream, Preset: preset,
			Limits: proxy.Limits{Requests: l[0], Tokens: l[1], InputTokens: l[2], OutputTokens: l[3]}}},
	}, nil
}
