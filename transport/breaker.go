package transport

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sony/gobreaker/v2"
)

// ErrCircuitOpen is matched by every *BreakerError.
var ErrCircuitOpen = errors.New("transport: circuit breaker open")

// BreakerError reports a request that the circuit breaker did not let
// through: it is open, or half-open with its probes already in flight.
// Nothing was sent and nothing taken from the bucket. It unwraps to
// gobreaker.ErrOpenState or gobreaker.ErrTooManyRequests.
type BreakerError struct {
	Name  string          // the breaker's Settings.Name
	State gobreaker.State // its state when the request was refused
	err   error
}

func (e *BreakerError) Error() string {
	name := ""
	if e.Name != "" {
		name = " " + strconv.Quote(e.Name)
	}
	if e.State == gobreaker.StateHalfOpen {
		return "transport: circuit breaker" + name + " is half-open and its probes are in flight"
	}
	return "transport: circuit breaker" + name + " is open"
}

// Is reports whether target is ErrCircuitOpen.
func (e *BreakerError) Is(target error) bool { return target == ErrCircuitOpen }

// Unwrap returns gobreaker's error.
func (e *BreakerError) Unwrap() error { return e.err }

// StatusError is what the circuit breaker is told of an attempt that got a
// 429 or 5xx response (see WithBreaker). RoundTrip never returns it.
type StatusError struct {
	StatusCode int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("transport: status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// breaker is a Transport's circuit breaker.
type breaker struct {
	cb   *gobreaker.TwoStepCircuitBreaker[struct{}]
	name string
}

// newBreaker builds the breaker s describes, with sluice's defaults for a
// nil IsSuccessful or IsExcluded, calling onChange on every state change.
func newBreaker(s gobreaker.Settings, onChange func(name string, from, to gobreaker.State)) *breaker {
	if s.IsExcluded == nil {
		s.IsExcluded = excludedFromBreaker
	}
	user := s.OnStateChange
	s.OnStateChange = func(name string, from, to gobreaker.State) {
		onChange(name, from, to)
		if user != nil {
			user(name, from, to)
		}
	}
	return &breaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](s), name: s.Name}
}

// excludedFromBreaker is the default IsExcluded: 429s and cancellations
// say nothing about the upstream's health.
func excludedFromBreaker(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.StatusCode == http.StatusTooManyRequests
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// open returns a *BreakerError if the breaker is open now.
func (b *breaker) open() error {
	if st := b.cb.State(); st == gobreaker.StateOpen {
		return &BreakerError{Name: b.name, State: st, err: gobreaker.ErrOpenState}
	}
	return nil
}

// allow asks the breaker to let one attempt through. done must be called
// with the attempt's outcome (see outcomeErr).
func (b *breaker) allow() (done func(error), err error) {
	done, err = b.cb.Allow()
	if err != nil {
		st := gobreaker.StateOpen
		if errors.Is(err, gobreaker.ErrTooManyRequests) {
			st = gobreaker.StateHalfOpen
		}
		return nil, &BreakerError{Name: b.name, State: st, err: err}
	}
	return done, nil
}

// outcomeErr is the error a breaker is told of an attempt.
func outcomeErr(ctx context.Context, resp *http.Response, err error) error {
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return err
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		return &StatusError{StatusCode: resp.StatusCode}
	}
	return nil
}
