package bucket

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInvalidLimit is matched by every *LimitError.
	ErrInvalidLimit = errors.New("bucket: invalid limit")
	// ErrInvalidCost is matched by a *CostError whose amount is negative or
	// not finite.
	ErrInvalidCost = errors.New("bucket: invalid cost")
	// ErrExceedsBurst is matched by a *CostError whose amount is larger than
	// the dimension's burst: no amount of waiting can admit it.
	ErrExceedsBurst = errors.New("bucket: cost exceeds burst")
	// ErrDeadline is matched by a *WaitError: the earliest slot lies past the
	// context's deadline or the maximum wait, so nothing was taken.
	ErrDeadline = errors.New("bucket: wait would exceed deadline")
)

// LimitError reports a Limit that cannot be used.
type LimitError struct {
	Dim    string // dimension the limit was given for ("" if none yet)
	Limit  Limit
	Reason string
}

func (e *LimitError) Error() string {
	if e.Dim == "" {
		return fmt.Sprintf("bucket: invalid limit %+v: %s", e.Limit, e.Reason)
	}
	return fmt.Sprintf("bucket: invalid limit %+v for %q: %s", e.Limit, e.Dim, e.Reason)
}

// Is reports whether target is ErrInvalidLimit.
func (e *LimitError) Is(target error) bool { return target == ErrInvalidLimit }

// CostError reports a cost that can never be admitted: an amount larger than
// its dimension's burst (errors.Is ErrExceedsBurst), or one that is negative
// or not finite (errors.Is ErrInvalidCost).
type CostError struct {
	Dim   string
	Cost  float64
	Burst float64
	err   error
}

func (e *CostError) Error() string {
	if e.err == ErrExceedsBurst {
		return fmt.Sprintf("bucket: cost %g of %q exceeds burst %g", e.Cost, e.Dim, e.Burst)
	}
	return fmt.Sprintf("bucket: invalid cost %g of %q", e.Cost, e.Dim)
}

// Unwrap returns ErrExceedsBurst or ErrInvalidCost.
func (e *CostError) Unwrap() error { return e.err }

// WaitError reports that a wait could not be met: the cost could be taken
// only after RetryAfter, later than MaxWait allowed. Nothing was taken.
type WaitError struct {
	RetryAfter time.Duration // time until the cost can be taken
	MaxWait    time.Duration // the wait that was allowed
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("bucket: wait of %v would exceed deadline (max wait %v)", e.RetryAfter, e.MaxWait)
}

// Is reports whether target is ErrDeadline.
func (e *WaitError) Is(target error) bool { return target == ErrDeadline }
