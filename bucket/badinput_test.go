package bucket_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestBadInput: every backend turns bad input down at once with a typed
// error and takes nothing: an empty key, negative, NaN, infinite and
// too-large costs, a done context; a negative maxWait means no wait.
func TestBadInput(t *testing.T) {
	rdb := redistest.Client(t)
	lim := bucket.Limit{Rate: 1, Burst: 5}
	opts := bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 100, Burst: 100})
	type tokener func(key string) float64
	redisTokens := func(tokens func(context.Context, string) (bucket.Cost, error)) tokener {
		return func(key string) float64 {
			c, err := tokens(context.Background(), key)
			require.NoError(t, err)
			return c[bucket.Requests]
		}
	}
	local := bucket.NewLocal(lim, opts)
	rb := bucket.NewRedis(rdb, lim, opts)
	fw := bucket.NewFixedWindow(rdb, bucket.PerMinute(5), opts)
	sl := bucket.NewSlidingLog(rdb, bucket.PerMinute(5), opts)
	for _, be := range []struct {
		name   string
		b      bucket.Bucket
		tokens tokener
	}{
		{"local", local, func(key string) float64 { return local.Tokens(key)[bucket.Requests] }},
		{"redis", rb, redisTokens(rb.Tokens)},
		{"fixed window", fw, redisTokens(fw.Tokens)},
		{"sliding log", sl, redisTokens(sl.Tokens)},
	} {
		t.Run(be.name, func(t *testing.T) {
			ctx := t.Context()
			b := be.b
			key := uniqueKey(t)

			_, err := b.Reserve(ctx, "", bucket.N(1), 0)
			assert.ErrorIs(t, err, bucket.ErrInvalidKey)
			assert.ErrorIs(t, b.Adjust(ctx, "", bucket.N(-1)), bucket.ErrInvalidKey)
			_, err = bucket.Wait(ctx, b, "", bucket.N(1))
			assert.ErrorIs(t, err, bucket.ErrInvalidKey)
			if _, ok := b.(*bucket.Redis); ok || b == local {
				assert.ErrorIs(t, b.Observe(ctx, "", adaptive.Feedback{Class: adaptive.RateLimited}), bucket.ErrInvalidKey)
			}

			for _, tc := range []struct {
				name string
				cost bucket.Cost
				want error
			}{
				{"negative", bucket.N(-1), bucket.ErrInvalidCost},
				{"negative second dimension", bucket.Cost{bucket.Requests: 1, bucket.Tokens: -1}, bucket.ErrInvalidCost},
				{"NaN", bucket.N(math.NaN()), bucket.ErrInvalidCost},
				{"+Inf", bucket.N(math.Inf(1)), bucket.ErrInvalidCost},
				{"-Inf", bucket.Cost{bucket.Tokens: math.Inf(-1)}, bucket.ErrInvalidCost},
				{"above burst", bucket.N(6), bucket.ErrExceedsBurst},
				{"above second burst", bucket.Cost{bucket.Requests: 1, bucket.Tokens: 101}, bucket.ErrExceedsBurst},
			} {
				r, err := b.Reserve(ctx, key, tc.cost, bucket.Unlimited)
				assert.ErrorIs(t, err, tc.want, tc.name)
				var ce *bucket.CostError
				assert.True(t, errors.As(err, &ce), "%s: %v", tc.name, err)
				assert.Equal(t, bucket.Reservation{}, r, tc.name)
				_, err = bucket.Wait(ctx, b, key, tc.cost)
				assert.ErrorIs(t, err, tc.want, tc.name)
			}
			for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
				assert.ErrorIs(t, b.Adjust(ctx, key, bucket.N(v)), bucket.ErrInvalidCost)
			}
			assert.InDelta(t, 5, be.tokens(key), 0.01, "nothing taken")

			done, cancel := context.WithCancel(ctx)
			cancel()
			_, err = bucket.Wait(done, b, key, bucket.N(1))
			assert.ErrorIs(t, err, context.Canceled)
			assert.InDelta(t, 5, be.tokens(key), 0.01, "nothing taken")

			// A negative maxWait is no wait at all.
			r, err := b.Reserve(ctx, key, bucket.N(5), -time.Second)
			require.NoError(t, err)
			assert.Equal(t, bucket.Reservation{OK: true}, r)
			r, err = b.Reserve(ctx, key, bucket.N(1), -time.Second)
			require.NoError(t, err)
			assert.False(t, r.OK)
			assert.Positive(t, r.RetryAfter)
		})
	}
}

// TestInvalidLimitsPanic: every constructor panics with a *LimitError on a
// zero, negative, NaN or infinite limit, in any dimension; a prefix with a
// brace panics too.
func TestInvalidLimitsPanic(t *testing.T) {
	ctors := map[string]func(bucket.Limit, ...bucket.Option){
		"local":        func(l bucket.Limit, o ...bucket.Option) { bucket.NewLocal(l, o...) },
		"redis":        func(l bucket.Limit, o ...bucket.Option) { bucket.NewRedis(nil, l, o...) },
		"fixed window": func(l bucket.Limit, o ...bucket.Option) { bucket.NewFixedWindow(nil, l, o...) },
		"sliding log":  func(l bucket.Limit, o ...bucket.Option) { bucket.NewSlidingLog(nil, l, o...) },
	}
	nan, inf := math.NaN(), math.Inf(1)
	for name, ctor := range ctors {
		for _, l := range []bucket.Limit{
			{}, {Rate: 0, Burst: 1}, {Rate: 1, Burst: 0}, {Rate: -1, Burst: 1}, {Rate: 1, Burst: -1},
			{Rate: nan, Burst: 1}, {Rate: 1, Burst: nan}, {Rate: inf, Burst: 1}, {Rate: 1, Burst: inf}, {Rate: -inf, Burst: 1},
		} {
			for dim, call := range map[string]func(){
				"requests": func() { ctor(l) },
				"tokens":   func() { ctor(bucket.PerSecond(1), bucket.WithLimit(bucket.Tokens, l)) },
			} {
				assert.PanicsWithError(t, (&bucket.LimitError{Dim: dim, Limit: l, Reason: reason(l)}).Error(), call,
					"%s %s %+v", name, dim, l)
			}
		}
	}
	for _, name := range []string{"redis", "fixed window", "sliding log"} {
		assert.Panics(t, func() { ctors[name](bucket.PerSecond(1), bucket.WithPrefix("a{b}")) }, name)
	}
}

// reason is what Limit.Validate says of l.
func reason(l bucket.Limit) string {
	var le *bucket.LimitError
	if !errors.As(l.Validate(), &le) {
		return ""
	}
	return le.Reason
}

// TestKeyNames pins how keys become Redis key names: as they are, braces
// and '%' escaped, and keys over 512 bytes hashed.
func TestKeyNames(t *testing.T) {
	srv := newClockedRedis(t, epoch)
	b := bucket.NewFixedWindow(srv.rdb, bucket.PerMinute(5), bucket.WithFailClosed())
	long := strings.Repeat("x", 513)
	sum := sha256.Sum256([]byte(long))
	for key, name := range map[string]string{
		"openai#abc":             "sluice:{openai#abc}:requests:window",
		"a}b":                    "sluice:{a%7Db}:requests:window",
		"{x}":                    "sluice:{%7Bx%7D}:requests:window",
		"100%":                   "sluice:{100%25}:requests:window",
		strings.Repeat("x", 512): "sluice:{" + strings.Repeat("x", 512) + "}:requests:window",
		long:                     "sluice:{%sha256:" + hex.EncodeToString(sum[:]) + "}:requests:window",
	} {
		srv.FlushAll()
		_, err := b.Reserve(t.Context(), key, bucket.N(1), 0)
		require.NoError(t, err)
		assert.Equal(t, []string{name}, srv.Keys())
	}
}

// TestRedisPasswordNotInErrors: a client with a wrong password fails
// (closed) or falls back (open) without the password in any error.
func TestRedisPasswordNotInErrors(t *testing.T) {
	const password, wrong = "correct-horse-battery", "wrong-staple-secret"
	srv := redistest.Own(t, "--requirepass", password)
	opt, err := redis.ParseURL("redis://:" + wrong + "@" + srv.Addr + "/0")
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })

	// A refused password is a configuration error, which failing open
	// must not hide (it did: the fleet ran on shares of one, for ever).
	for _, b := range []*bucket.Redis{
		bucket.NewRedis(rdb, bucket.PerSecond(10), bucket.WithFailClosed()),
		bucket.NewRedis(rdb, bucket.PerSecond(10)),
	} {
		r, err := b.Reserve(t.Context(), "k", bucket.N(1), time.Second)
		require.ErrorIs(t, err, bucket.ErrMisconfigured)
		assert.False(t, r.OK)
		t.Log(err)
		assert.Contains(t, err.Error(), srv.Addr)
		for _, secret := range []string{password, wrong} {
			assert.NotContains(t, err.Error(), secret)
		}
	}
}
