package proxy

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/bucket"
)

// Config is the whole configuration of a proxy: what a YAML file holds
// (see Load) or the quick start's flags build. Zero fields take the
// defaults named on them.
type Config struct {
	// Listen is the address the proxy serves its routes on; "" means
	// 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// Admin is the address of /healthz, /readyz and /metrics; "" means
	// 127.0.0.1:9090, "off" serves none.
	Admin string      `yaml:"admin"`
	Redis RedisConfig `yaml:"redis"`
	// MaxWait is the longest a request waits for the quota: one that would
	// wait longer is answered 429 at once, in its provider's shape, with
	// the time to come back. Zero means 60s.
	MaxWait time.Duration `yaml:"max_wait"`
	// MaxBodyBytes caps a request's body: a larger one is answered 413.
	// Zero means 32 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// WriteTimeout bounds the writing of a response that is not a stream,
	// from its headers' arrival; a stream has no write deadline. Zero
	// means 10m.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// ReadHeaderTimeout bounds the reading of a request's headers; zero
	// means 10s. IdleTimeout is how long an idle client connection is kept;
	// zero means 2m.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	// DrainTimeout is how long SIGTERM lets open requests and streams
	// finish before they are cut. Zero means 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// Routes map path prefixes to upstreams; at least one.
	Routes []Route `yaml:"routes"`
}

// RedisConfig says where the fleet's shared quota lives. Empty, each proxy
// has a bucket of its own in memory (bucket.Local).
type RedisConfig struct {
	// URL is a single server's: redis://[user:password@]host:port/db, or
	// rediss:// for TLS.
	URL string `yaml:"url"`
	// Addrs are the nodes of a Redis Cluster, or the sentinels of
	// MasterName's if it is set. Username and Password go with them.
	Addrs      []string `yaml:"addrs"`
	MasterName string   `yaml:"master_name"`
	Username   string   `yaml:"username"`
	Password   string   `yaml:"password"`
	// FailClosed answers 503 while Redis is unavailable, instead of
	// admitting from this proxy's share of the limits (the default, see
	// bucket.WithFailOpen).
	FailClosed bool `yaml:"fail_closed"`
}

// Route sends the requests whose path starts with Prefix to Upstream,
// Prefix taken off and the path appended to Upstream's.
type Route struct {
	// Prefix is a path prefix, matched at a "/" boundary; "/" matches
	// every path. The longest matching prefix wins.
	Prefix string `yaml:"prefix"`
	// Upstream is the provider's base URL: https://api.openai.com.
	Upstream string `yaml:"upstream"`
	// Preset is how requests are keyed and charged: openai (per API key
	// and model, requests and tokens), anthropic (requests, input and
	// output tokens), gemini (per API key and model, requests) or generic
	// (per API key, requests). "" means openai.
	Preset string `yaml:"preset"`
	// Limits are those of every model the route's Models do not name.
	Limits Limits `yaml:"limits"`
	// Models gives a model its own limits, by the name requests give.
	Models map[string]Limits `yaml:"models"`
}

// Limits are one model's limits, each "N/s", "N/min" or "N/h", with an
// optional burst: "500/min", "10/s burst 20". An empty one is no limit.
// The burst is N unless given.
type Limits struct {
	Requests     string `yaml:"requests"`
	Tokens       string `yaml:"tokens"`
	InputTokens  string `yaml:"input_tokens"`
	OutputTokens string `yaml:"output_tokens"`
}

// Defaults.
const (
	defaultListen       = "127.0.0.1:8080"
	defaultAdmin        = "127.0.0.1:9090"
	defaultMaxWait      = 60 * time.Second
	defaultMaxBody      = 32 << 20
	defaultWriteTimeout = 10 * time.Minute
	defaultReadHeader   = 10 * time.Second
	defaultIdle         = 2 * time.Minute
	defaultDrain        = 30 * time.Second
	// maxMaxWait and maxMaxBody bound what a configuration may ask.
	maxMaxWait = 24 * time.Hour
	maxMaxBody = 1 << 30
)

// Presets.
const (
	presetOpenAI    = "openai"
	presetAnthropic = "anthropic"
	presetGemini    = "gemini"
	presetGeneric   = "generic"
)

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Listen == "" {
		c.Listen = defaultListen
	}
	if c.Admin == "" {
		c.Admin = defaultAdmin
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = defaultMaxBody
	}
	def(&c.MaxWait, defaultMaxWait)
	def(&c.WriteTimeout, defaultWriteTimeout)
	def(&c.ReadHeaderTimeout, defaultReadHeader)
	def(&c.IdleTimeout, defaultIdle)
	def(&c.DrainTimeout, defaultDrain)
	c.Routes = append([]Route(nil), c.Routes...)
	for i := range c.Routes {
		if c.Routes[i].Preset == "" {
			c.Routes[i].Preset = presetOpenAI
		}
	}
	return c
}

// A FieldError is a configuration field whose value cannot be used.
type FieldError struct {
	// Where is what names the field to its author: "proxy.yaml:12" for a
	// file's, "--tpm" for a flag's.
	Where string
	Field string // its path: routes[0].limits.tokens
	Msg   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("sluice: config %s: %s: %s", e.Where, e.Field, e.Msg)
}

// fieldErr is an error in the field at path, to be placed (see place).
type fieldErr struct {
	path []string // mapping keys and "[i]" indices
	msg  string
}

// validate checks every field of c (defaults applied) and returns what is
// wrong, in the order of the fields.
func (c Config) validate() []fieldErr {
	var errs []fieldErr
	bad := func(msg string, path ...string) { errs = append(errs, fieldErr{path, msg}) }
	switch {
	case c.MaxWait < 0 || c.MaxWait > maxMaxWait:
		bad(fmt.Sprintf("must be from 0 to %v", maxMaxWait), "max_wait")
	}
	if c.MaxBodyBytes < 0 || c.MaxBodyBytes > maxMaxBody {
		bad(fmt.Sprintf("must be from 0 to %d", maxMaxBody), "max_body_bytes")
	}
	for name, d := range map[string]time.Duration{"write_timeout": c.WriteTimeout,
		"read_header_timeout": c.ReadHeaderTimeout, "idle_timeout": c.IdleTimeout, "drain_timeout": c.DrainTimeout} {
		if d < 0 {
			bad("must not be negative", name)
		}
	}
	errs = append(errs, c.Redis.validate()...)
	if len(c.Routes) == 0 {
		bad("at least one route is needed", "routes")
	}
	seen := map[string]bool{}
	for i, r := range c.Routes {
		at := "[" + strconv.Itoa(i) + "]"
		for _, e := range r.validate() {
			errs = append(errs, fieldErr{append([]string{"routes", at}, e.path...), e.msg})
		}
		p := normPrefix(r.Prefix)
		if seen[p] {
			bad("prefix "+strconv.Quote(r.Prefix)+" is another route's too", "routes", at, "prefix")
		}
		seen[p] = true
	}
	return errs
}

func (rc RedisConfig) validate() []fieldErr {
	var errs []fieldErr
	if rc.URL != "" && len(rc.Addrs) > 0 {
		errs = append(errs, fieldErr{[]string{"redis", "addrs"}, "give url or addrs, not both"})
	}
	if rc.URL != "" {
		if _, err := redisURL(rc.URL); err != nil {
			errs = append(errs, fieldErr{[]string{"redis", "url"}, err.Error()})
		}
	}
	if rc.MasterName != "" && len(rc.Addrs) == 0 {
		errs = append(errs, fieldErr{[]string{"redis", "addrs"}, "master_name needs the sentinels' addrs"})
	}
	return errs
}

func (r Route) validate() []fieldErr {
	var errs []fieldErr
	bad := func(msg string, path ...string) { errs = append(errs, fieldErr{path, msg}) }
	if !strings.HasPrefix(r.Prefix, "/") {
		bad("must start with /", "prefix")
	}
	if u, err := url.Parse(r.Upstream); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("must be an http:// or https:// URL with a host", "upstream")
	} else if u.RawQuery != "" || u.User != nil {
		bad("must carry no query and no user info", "upstream")
	}
	switch r.Preset {
	case presetOpenAI, presetAnthropic, presetGemini, presetGeneric:
	default:
		bad("must be openai, anthropic, gemini or generic", "preset")
	}
	errs = append(errs, r.Limits.validate(r.Preset, "limits")...)
	names := make([]string, 0, len(r.Models))
	for m := range r.Models {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		if m == "" || len(m) > 256 {
			bad("a model's name must have 1 to 256 characters", "models")
		}
		errs = append(errs, r.Models[m].validate(r.Preset, "models", m)...)
	}
	return errs
}

// validate checks each limit of l, under the path at.
func (l Limits) validate(preset string, at ...string) []fieldErr {
	var errs []fieldErr
	for _, f := range l.fields() {
		if f.value == "" {
			continue
		}
		path := append(append([]string(nil), at...), f.yaml)
		if _, err := parseLimit(f.value); err != nil {
			errs = append(errs, fieldErr{path, err.Error()})
			continue
		}
		if !presetCharges(preset, f.dim) {
			errs = append(errs, fieldErr{path, "the " + preset + " preset charges no " + f.dim +
				": the limit would never be reached"})
		}
	}
	return errs
}

// presetCharges reports whether a route of preset charges dimension dim.
func presetCharges(preset, dim string) bool {
	switch dim {
	case bucket.Requests:
		return true
	case bucket.Tokens:
		return preset == presetOpenAI
	case bucket.InputTokens, bucket.OutputTokens:
		return preset == presetAnthropic
	}
	return false
}

// limitField is one limit of a Limits, named for YAML and for the bucket.
type limitField struct {
	yaml, dim, value string
}

func (l Limits) fields() []limitField {
	return []limitField{
		{"requests", bucket.Requests, l.Requests},
		{"tokens", bucket.Tokens, l.Tokens},
		{"input_tokens", bucket.InputTokens, l.InputTokens},
		{"output_tokens", bucket.OutputTokens, l.OutputTokens},
	}
}

// empty reports whether l limits nothing.
func (l Limits) empty() bool {
	for _, f := range l.fields() {
		if f.value != "" {
			return false
		}
	}
	return true
}

var limitRE = regexp.MustCompile(`^\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*(?:burst\s+([0-9]+(?:\.[0-9]+)?))?\s*$`)

// parseLimit parses "N/s", "N/min" or "N/h", with an optional " burst B",
// into a Limit that bucket.Limit.Validate accepts.
func parseLimit(s string) (bucket.Limit, error) {
	m := limitRE.FindStringSubmatch(s)
	if m == nil {
		return bucket.Limit{}, fmt.Errorf("%q is not a limit: want N/s, N/min or N/h, and optionally \" burst B\"", s)
	}
	n, _ := strconv.ParseFloat(m[1], 64)
	per := map[string]float64{"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}[m[2]]
	l := bucket.Limit{Rate: n / per, Burst: n}
	if m[3] != "" {
		l.Burst, _ = strconv.ParseFloat(m[3], 64)
	}
	if err := l.Validate(); err != nil {
		var le *bucket.LimitError
		if errors.As(err, &le) {
			return l, fmt.Errorf("%q is out of range: %s", s, le.Reason)
		}
		return l, err
	}
	return l, nil
}

// Check applies the defaults to c and checks it as Load does: the error is
// a *FieldError naming the first field that is wrong (its Where is
// "config"), for a configuration not read from a file.
func Check(c Config) (Config, error) {
	c = c.withDefaults()
	if errs := c.validate(); len(errs) > 0 {
		return c, &FieldError{Where: "config", Field: dotted(errs[0].path), Msg: errs[0].msg}
	}
	return c, nil
}

// normPrefix is p without its trailing "/": "" for the root.
func normPrefix(p string) string { return strings.TrimRight(p, "/") }

// Load reads the YAML configuration in file, with every ${VAR} (or
// ${VAR:-default}) in its values replaced by the environment's VAR, and
// checks it: an error names the file, the line and the field (a
// *FieldError, or yaml's own error prefixed by the file's name). Unknown
// fields are errors.
func Load(file string) (Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Config{}, fmt.Errorf("sluice: config: %w", err)
	}
	return parse(file, data, os.LookupEnv)
}

// parse is Load of data, read from file, with env for the environment.
func parse(file string, data []byte, env func(string) (string, bool)) (Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Config{}, fmt.Errorf("sluice: config %s: %w", file, err)
	}
	if doc.Kind == 0 {
		return Config{}, &FieldError{Where: file, Field: "routes", Msg: "the file is empty"}
	}
	if err := expand(&doc, file, env); err != nil {
		return Config{}, err
	}
	if err := known(&doc, reflect.TypeFor[Config](), nil); err != nil {
		return Config{}, &FieldError{Where: file + ":" + strconv.Itoa(err.line), Field: dotted(err.path), Msg: err.msg}
	}
	var c Config
	if err := doc.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("sluice: config %s: %w", file, err)
	}
	c = c.withDefaults()
	if errs := c.validate(); len(errs) > 0 {
		e := errs[0]
		return Config{}, &FieldError{Where: file + ":" + strconv.Itoa(lineOf(&doc, e.path)), Field: dotted(e.path), Msg: e.msg}
	}
	return c, nil
}

// unknownField is a key of the file that the configuration has no field for.
type unknownField struct {
	line int
	path []string
	msg  string
}

// known checks that every key of the mappings in n names a field of t (by
// its yaml tag), all the way down: a misspelt key is an error, not a
// setting silently ignored.
func known(n *yaml.Node, t reflect.Type, path []string) *unknownField {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil // Decode says what is wrong
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			f, ok := fieldByTag(t, k.Value)
			if !ok {
				return &unknownField{k.Line, append(path, k.Value), "no such field"}
			}
			if err := known(n.Content[i+1], f.Type, append(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		for i, c := range n.Content {
			if err := known(c, t.Elem(), append(path, "["+strconv.Itoa(i)+"]")); err != nil {
				return err
			}
		}
	case reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := known(n.Content[i+1], t.Elem(), append(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

// fieldByTag returns t's field whose yaml tag is name.
func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

var envRE = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}`)

// expand replaces ${VAR} and ${VAR:-default} in every scalar value of n
// with the environment's VAR: a value stays one scalar, whatever the
// variable holds. A variable that is not set, and has no default, is an
// error naming its line.
func expand(n *yaml.Node, file string, env func(string) (string, bool)) error {
	if n.Kind == yaml.ScalarNode && strings.Contains(n.Value, "${") {
		var missing string
		n.Value = envRE.ReplaceAllStringFunc(n.Value, func(m string) string {
			sub := envRE.FindStringSubmatch(m)
			if v, ok := env(sub[1]); ok {
				return v
			}
			if sub[2] != "" {
				return sub[2][2:]
			}
			if missing == "" {
				missing = sub[1]
			}
			return ""
		})
		if missing != "" {
			return fmt.Errorf("sluice: config %s:%d: ${%s} is not set in the environment", file, n.Line, missing)
		}
		if n.Tag == "!!str" || n.Style != 0 {
			return nil
		}
		n.Tag = "" // resolve the expanded value anew: a number, a duration
	}
	for _, c := range n.Content {
		if err := expand(c, file, env); err != nil {
			return err
		}
	}
	return nil
}

// lineOf returns the line of the field at path in doc, or of the nearest
// field above it that the file has.
func lineOf(doc *yaml.Node, path []string) int {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, p := range path {
		next := child(n, p)
		if next == nil {
			break
		}
		line = next.key.Line
		n = next.value
	}
	return line
}

type keyValue struct{ key, value *yaml.Node }

// child returns the entry of mapping n keyed p, or element p ("[i]") of
// sequence n, or nil.
func child(n *yaml.Node, p string) *keyValue {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == p {
				return &keyValue{n.Content[i], n.Content[i+1]}
			}
		}
	case yaml.SequenceNode:
		i, err := strconv.Atoi(strings.Trim(p, "[]"))
		if err == nil && i >= 0 && i < len(n.Content) {
			return &keyValue{n.Content[i], n.Content[i]}
		}
	}
	return nil
}

// dotted writes path as routes[0].limits.tokens.
func dotted(path []string) string {
	var b strings.Builder
	for i, p := range path {
		if i > 0 && !strings.HasPrefix(p, "[") {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}
