package adaptive_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/adaptive"
)

// TestPolicyValidate: the zero Policy is valid (it is the default one, see
// internal/law); every field out of its range is named in an error
// wrapping ErrInvalidPolicy. A negative MinEpoch is none, not an error.
func TestPolicyValidate(t *testing.T) {
	assert.NoError(t, adaptive.Policy{}.Validate())
	assert.NoError(t, adaptive.DefaultPolicy().Validate())
	assert.NoError(t, adaptive.Policy{Floor: 1, MinEpoch: -1, Recovery: adaptive.Additive}.Validate())
	nan, inf := math.NaN(), math.Inf(1)
	bad := map[string]adaptive.Policy{
		"Decrease":         {Decrease: 1},
		"Threshold":        {Threshold: -1},
		"ThresholdWindows": {ThresholdWindows: inf},
		"Floor":            {Floor: 1.5},
		"RecoveryWindows":  {RecoveryWindows: nan},
		"MinEpoch":         {MinEpoch: nan},
		"HoldWindows":      {HoldWindows: -1},
		"recovery law":     {Recovery: 7},
	}
	for field, p := range bad {
		err := p.Validate()
		assert.ErrorIs(t, err, adaptive.ErrInvalidPolicy, field)
		assert.ErrorContains(t, err, field)
	}
	assert.ErrorContains(t, adaptive.Policy{HoldWindows: nan}.Validate(), "HoldWindows")
	assert.ErrorContains(t, adaptive.Policy{MinEpoch: -inf}.Validate(), "MinEpoch")
	assert.ErrorContains(t, adaptive.Policy{Floor: 1e-7}.Validate(), "Floor")
}
