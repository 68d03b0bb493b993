package law_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/internal/law"
)

// TestWithDefaults: the zero Policy is the default one; a field set is
// kept, and so is a negative MinEpoch (none).
func TestWithDefaults(t *testing.T) {
	assert.Equal(t, adaptive.DefaultPolicy(), law.WithDefaults(adaptive.Policy{}))
	p := law.WithDefaults(adaptive.Policy{Decrease: 0.5, MinEpoch: -1, Recovery: adaptive.Additive})
	assert.Equal(t, 0.5, p.Decrease)
	assert.Equal(t, -1.0, p.MinEpoch)
	assert.Equal(t, adaptive.Additive, p.Recovery)
	assert.Equal(t, adaptive.DefaultPolicy().Threshold, p.Threshold)
}

// TestDecreased: a cut multiplies by Decrease, down to Floor, and no lower
// than a held rate (one the key kept for HoldWindows), which never raises
// the rate.
func TestDecreased(t *testing.T) {
	p := law.WithDefaults(adaptive.Policy{Decrease: 0.5, Floor: 0.1})
	for _, tc := range []struct {
		name             string
		frac, held, want float64
	}{
		{"multiplied", 0.8, 0, 0.4},
		{"floor", 0.15, 0, 0.1},
		{"held: back to it", 0.52, 0.5, 0.5},
		{"held: lower than Decrease goes", 0.8, 0.3, 0.4},
		{"held: never above the rate", 0.4, 0.6, 0.4},
	} {
		assert.InDelta(t, tc.want, law.Decreased(p, tc.frac, tc.held), 1e-12, tc.name)
	}
}

// TestFraction: Cubic climbs by u³, Additive by u, from the cut, never
// above the ceiling.
func TestFraction(t *testing.T) {
	span := 100 * time.Second
	for _, tc := range []struct {
		name    string
		law     adaptive.Recovery
		elapsed time.Duration
		want    float64
	}{
		{"cubic at the cut", adaptive.Cubic, 0, 0.5},
		{"cubic halfway", adaptive.Cubic, 50 * time.Second, 0.5 + 0.125},
		{"cubic capped", adaptive.Cubic, 90 * time.Second, 1},
		{"additive a fifth in", adaptive.Additive, 20 * time.Second, 0.7},
		{"additive capped", adaptive.Additive, 60 * time.Second, 1},
		{"before the cut", adaptive.Additive, -time.Second, 0.5},
	} {
		assert.InDelta(t, tc.want, law.Fraction(adaptive.Policy{Recovery: tc.law}, 0.5, tc.elapsed, span), 1e-12, tc.name)
	}
}
