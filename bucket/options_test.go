package bucket_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/bucket"
)

// TestOptionsAreForTheirBackends: every option is either taken by a
// constructor, which then uses it (the test named beside it shows how), or
// refused with a panic that names it and the constructors it is for; none
// is accepted and ignored. NewLocal took WithPrefix, WithFailClosed and
// WithRedisBreaker and did nothing with them; the window buckets took
// WithPolicy, and their Observe does nothing.
func TestOptionsAreForTheirBackends(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // constructors make no call
	t.Cleanup(func() { rdb.Close() })
	lim := bucket.PerSecond(10)
	ctors := map[string]func(...bucket.Option){
		"NewLocal":       func(o ...bucket.Option) { bucket.NewLocal(lim, o...) },
		"NewRedis":       func(o ...bucket.Option) { bucket.NewRedis(rdb, lim, o...) },
		"NewFixedWindow": func(o ...bucket.Option) { bucket.NewFixedWindow(rdb, lim, o...) },
		"NewSlidingLog":  func(o ...bucket.Option) { bucket.NewSlidingLog(rdb, lim, o...) },
		"NewInFlight":    func(o ...bucket.Option) { bucket.NewInFlight(rdb, 1, o...) },
	}
	all := []string{"NewLocal", "NewRedis", "NewFixedWindow", "NewSlidingLog"}
	stored := all[1:]
	shared := append(stored[:3:3], "NewInFlight")
	ctorNames := append(all[:4:4], "NewInFlight")
	for _, o := range []struct {
		name   string
		opt    bucket.Option
		takers []string
		used   string // where its use is pinned
	}{
		{"WithLimit", bucket.WithLimit(bucket.Tokens, bucket.PerSecond(100)), all, "TestFleetConservation/two_dimensions, TestFixedWindowTwoDimensionsAllOrNothing, TestSlidingLogKeysAndTTL"},
		{"WithClock", bucket.WithClock(&fakeClock{t: epoch}), all, "every test under backends (controlled time); the share's: TestFleetMembers"},
		{"WithPolicy", bucket.WithPolicy(adaptive.DefaultPolicy()), []string{"NewLocal", "NewRedis"}, "TestObserve"},
		{"WithPrefix", bucket.WithPrefix("p"), shared, "TestRedisKeysAndTTL, TestFixedWindowKeysTTLAndPrecision, TestInFlightKeys"},
		{"WithFailOpen", bucket.WithFailOpen(), shared, "TestFailOpen, TestWindowBucketsSettleTheirShares, TestInFlightRedisDown"},
		{"WithFailClosed", bucket.WithFailClosed(), shared, "TestFailClosed, TestFixedWindowAndSlidingLogRejectImpossibleCosts, TestInFlightRedisDown"},
		{"WithRedisTimeout", bucket.WithRedisTimeout(time.Second), shared, "TestBreakerBoundsOutageCost, TestInFlightKeys"},
		{"WithEvictionAllowed", bucket.WithEvictionAllowed(), shared, "TestMisconfiguredRedis, TestInFlightMisconfiguredRedis"},
		{"WithLogger", bucket.WithLogger(slog.Default()), append(shared[:4:4], "NewLocal"), "TestMisconfiguredRedis, TestInFlightMisconfiguredRedis, TestLowLimitWarned"},
		{"WithRedisBreaker", bucket.WithRedisBreaker(gobreaker.Settings{}), shared, "TestLostReplyOpensNoBreaker, TestWindowBucketsSettleTheirShares, TestInFlightRedisDown"},
		{"WithLease", bucket.WithLease(time.Second), []string{"NewInFlight"}, "TestInFlightLeaseFreesDeadHolder"},
		{"WithLeasing", bucket.WithLeasing(100, 100*time.Millisecond), []string{"NewRedis"}, "TestLeaseServesLocallyAndGivesBack"},
	} {
		for _, ctor := range ctorNames {
			t.Run(o.name+"/"+ctor, func(t *testing.T) {
				make := func() { ctors[ctor](o.opt) }
				for _, taker := range o.takers {
					if taker == ctor {
						assert.NotPanics(t, make, "used: %s", o.used)
						return
					}
				}
				assert.PanicsWithValue(t, "bucket: "+ctor+" does not take "+o.name+" (an option of "+forNames(o.takers)+")", make)
			})
		}
	}
}

// forNames is how a refusal names the constructors in takers.
func forNames(takers []string) string {
	switch len(takers) {
	case 1:
		return takers[0]
	case 2:
		return "NewLocal, NewRedis"
	case 3:
		return "NewRedis, NewFixedWindow, NewSlidingLog"
	case 4:
		if takers[0] == "NewLocal" {
			return "NewLocal, NewRedis, NewFixedWindow, NewSlidingLog"
		}
		return "NewRedis, NewFixedWindow, NewSlidingLog, NewInFlight"
	}
	return ""
}
