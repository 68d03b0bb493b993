package bucket_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/bucket"
)

func TestLimit(t *testing.T) {
	assert.Equal(t, bucket.Limit{Rate: 20, Burst: 20}, bucket.PerSecond(20))
	assert.Equal(t, bucket.Limit{Rate: 10, Burst: 600}, bucket.PerMinute(600))
	assert.Equal(t, "0.5/s burst 30", bucket.PerMinute(30).String())
	assert.Equal(t, bucket.Cost{bucket.Requests: 2}, bucket.N(2))

	for _, l := range []bucket.Limit{
		{}, {Rate: 1}, {Burst: 1}, {Rate: -1, Burst: 1}, {Rate: 1, Burst: -1},
		{Rate: math.NaN(), Burst: 1}, {Rate: math.Inf(1), Burst: 1}, {Rate: 1, Burst: math.Inf(1)},
	} {
		err := l.Validate()
		assert.ErrorIs(t, err, bucket.ErrInvalidLimit, "%+v", l)
	}
	assert.NoError(t, bucket.PerMinute(0.5).Validate())
}

func TestConstructorsPanicOnInvalidLimit(t *testing.T) {
	for name, f := range map[string]func(){
		"local":         func() { bucket.NewLocal(bucket.Limit{}) },
		"local dim":     func() { bucket.NewLocal(bucket.PerSecond(1), bucket.WithLimit(bucket.Tokens, bucket.Limit{Rate: 1})) },
		"local no name": func() { bucket.NewLocal(bucket.PerSecond(1), bucket.WithLimit("", bucket.PerSecond(1))) },
		"redis":         func() { bucket.NewRedis(nil, bucket.Limit{Rate: -1, Burst: 1}) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				err, _ := recover().(error)
				var le *bucket.LimitError
				assert.True(t, errors.As(err, &le), "panic value %v", err)
				assert.ErrorIs(t, err, bucket.ErrInvalidLimit)
			}()
			f()
		})
	}
}
