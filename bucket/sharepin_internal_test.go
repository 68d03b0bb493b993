package bucket

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLowerPinAsTheScriptsDo: the fail-open share reads a pinned limit as
// the scripts do (pinOne): the lower of its own and the pin, but a pin more
// than maxPinRatio times below its own is a configuration error that holds
// nothing. A pin of 0.001/s read by a process of 50/s held its share to
// 0.001/n a second for the whole outage, where the scripts ignore it.
func TestLowerPinAsTheScriptsDo(t *testing.T) {
	for _, tt := range []struct {
		name string
		v    any
		want float64
	}{
		{"lower", "25000000", 25},
		{"higher", "100000000", 50},
		{"at the ratio", "50000", 0.05},
		{"past the ratio", "1000", 50},
		{"below a Limit's range", "0", 50},
		{"malformed", "fast", 50},
		{"not a string", int64(25000000), 50},
		{"NaN", "nan", 50},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.InDelta(t, tt.want, lowerPin(50, tt.v, minRate), 1e-9)
		})
	}
}
