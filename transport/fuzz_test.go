package transport_test

import (
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/transport"
)

// FuzzRetryAfter: whatever a server sends in Retry-After and
// retry-after-ms, the parser neither panics nor returns a negative delay,
// and a well-formed number of seconds is read exactly (rounded up).
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "1", "1.5", "-1", "NaN", "Inf", "1e400", "0x10",
		"Wed, 21 Oct 2015 07:28:00 GMT", "Sun Nov  6 08:49:37 1994", "soon", "99999999999999999999"} {
		f.Add(s, "")
		f.Add("", s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ra, raMs string) {
		h := http.Header{}
		if ra != "" {
			h.Set("Retry-After", ra)
		}
		if raMs != "" {
			h.Set("Retry-After-Ms", raMs)
		}
		d, ok := transport.RetryAfter(h, now)
		if d < 0 {
			t.Fatalf("negative delay %v for Retry-After %q, retry-after-ms %q", d, ra, raMs)
		}
		if !ok && d != 0 {
			t.Fatalf("delay %v without ok", d)
		}
		if raMs != "" {
			return
		}
		if n, err := strconv.ParseInt(ra, 10, 64); err == nil && n >= 0 && n < math.MaxInt64/int64(time.Second) {
			if !ok || d != time.Duration(n)*time.Second {
				t.Fatalf("Retry-After %q: got %v %v, want %v", ra, d, ok, time.Duration(n)*time.Second)
			}
		}
	})
}
