package adaptive_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/adaptive"
)

// TestPolicyValidate: the zero Policy is the default one; every field out of
// its range is named in an error wrapping ErrInvalidPolicy.
func TestPolicyValidate(t *testing.T) {
	assert.Equal(t, adaptive.DefaultPolicy(), adaptive.Policy{}.WithDefaults())
	assert.NoError(t, adaptive.Policy{}.Validate())
	assert.NoError(t, adaptive.Policy{Floor: 1, MinEpoch: 1e-9, Recovery: adaptive.Additive}.Validate())
	nan, inf := math.NaN(), math.Inf(1)
	bad := map[string]adaptive.Policy{
		"Decrease":         {Decrease: 1},
		"Threshold":        {Threshold: -1},
		"ThresholdWindows": {ThresholdWindows: inf},
		"Floor":            {Floor: 1.5},
		"RecoveryWindows":  {RecoveryWindows: nan},
		"MinEpoch":         {MinEpoch: -1},
		"HoldWindows":      {HoldWindows: -1},
		"recovery law":     {Recovery: 7},
	}
	for field, p := range bad {
		err := p.Validate()
		assert.ErrorIs(t, err, adaptive.ErrInvalidPolicy, field)
		assert.ErrorContains(t, err, field)
	}
	assert.ErrorContains(t, adaptive.Policy{HoldWindows: nan}.Validate(), "HoldWindows")
}

// TestDecreased: a cut multiplies by Decrease, down to Floor, and no lower
// than a held rate (one the key kept for HoldWindows), which never raises
// the rate.
func TestDecreased(t *testing.T) {
	p := adaptive.Policy{Decrease: 0.5, Floor: 0.1}.WithDefaults()
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
		assert.InDelta(t, tc.want, p.Decreased(tc.frac, tc.held), 1e-12, tc.name)
	}
}
